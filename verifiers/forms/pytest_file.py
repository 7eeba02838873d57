"""``pytest``: a test file that imports the program as a module (``from solution import f``) and
is run by pytest, one test per test function (KodCode's ``test``, AceCoder-style test modules).

KodCode's harness and rllm's KodCode reward write the program as ``solution.py`` beside the
test file and run ``pytest`` in one process with it, judging by its exit status. Here the test
file runs in the judge (``sandbox/runner/pytest_judge.py``) and reaches the program through the
judge's RPC like every other test, so the program cannot patch pytest or its assertion
rewriting, leave a ``conftest.py`` or ``pytest.ini``, or exit early with status 0: a test
passes only when pytest ran it in the judge and it raised nothing.

What the test file reaches only in the program's own process does not work: the program's
prints (``capsys``), patches of its builtins (``monkeypatch.setattr("builtins.input", ...)``),
files it reads from the test's ``tmp_path``, and exception classes it defines
(``pytest.raises(ProgramError)``; a builtin base such as ``ValueError`` works).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import field_validator, model_validator

from ...sandbox import Job, JudgeSpec, Limits
from ..python_ast import parse_problem_code
from . import FormTests, JudgedForm, kept_with_tests, register

if TYPE_CHECKING:
    from ..problems import Problem

JUDGE_SETUP = (
    "from runner.pytest_judge import run_test_file\n"
    "__check = run_test_file({source!r}, filename={filename!r}, module={module!r}, "
    "bound={bound!r}, entry_points={entry_points!r}, remote=__remote__, "
    "remote_names=__remote_names__)\n"
    "del run_test_file\n"
)


class PytestTests(FormTests):
    form: Literal["pytest"] = "pytest"
    test_file: str  # a pytest module
    module: str = "solution"  # the name it imports the program as
    entry_points: tuple[str, ...] = ()  # the functions under test (KodCode's test_info)

    @field_validator("module")
    @classmethod
    def _a_module_name(cls, name: str) -> str:
        if not name.isidentifier():
            raise ValueError(f"not a module name: {name!r}")
        return name

    @model_validator(mode="after")
    def _has_tests(self) -> PytestTests:
        if not names_of(self).functions:
            raise ValueError("test_file has no test functions (test_* or Test*.test_*)")
        return self

    def count(self) -> int:
        return len(names_of(self).functions)

    def public(self) -> PytestTests:
        """The first test function pytest collects, with the file's imports, fixtures and
        helpers; the other test functions (and test classes) left out."""
        return first_test(self)

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        key = names_of(self).functions[index]
        module = parse_problem_code(self.test_file, "test_file")
        sources = [ast.unparse(node) for name, node in test_definitions(module) if name == key]
        return (("Test", "\n\n".join(sources)),)


class PytestForm(JudgedForm):
    tests_model = PytestTests
    marker = "test_file"

    def instructions(self, problem: Problem) -> list[str]:
        tests: PytestTests = problem.tests  # type: ignore[assignment]
        names = list(names_of(tests).imported or tests.entry_points)
        defines = f"; it must define {', '.join(f'`{n}`' for n in names)}" if names else ""
        return [
            f"Your code is imported as the module `{tests.module}` and tested with pytest{defines}."
        ]

    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        tests: PytestTests = problem.tests  # type: ignore[assignment]
        names = names_of(tests)
        setup = JUDGE_SETUP.format(
            source=tests.test_file,
            filename=f"test_{tests.module}.py",
            module=tests.module,
            bound=sorted(names.bound),
            entry_points=list(tests.entry_points),
        )
        keys = names.functions
        return Job(
            program=program,
            judge=JudgeSpec(
                setup=setup,
                tests=tuple(f"__check({key!r})\n" for key in keys),
                test_names=keys,
                pytest=True,
            ),
            limits=limits,
        )


register(PytestForm())


class PytestNames(NamedTuple):
    """What the verifier reads of a test file, from one parse of it."""

    functions: tuple[str, ...]  # the test functions pytest collects
    bound: frozenset[str]  # the names the file binds at its top level
    imported: tuple[str, ...]  # the names it imports from the program's module


@kept_with_tests
def names_of(tests: PytestTests) -> PytestNames:
    try:
        module = parse_problem_code(tests.test_file, "test_file")
    except SyntaxError as exc:
        raise ValueError(f"test_file is not valid Python: {exc.msg} (line {exc.lineno})") from None
    return PytestNames(
        pytest_functions(module), bound_names(module), imported_names(module, tests.module)
    )


def pytest_functions(module: ast.Module) -> tuple[str, ...]:
    """The test functions pytest collects from a module, by its default rules: ``test*``
    functions, and ``test*`` methods of ``Test*`` classes without ``__init__`` or of
    ``unittest.TestCase`` subclasses (``Class::method``)."""
    return tuple(dict.fromkeys(key for key, _ in test_definitions(module)))


TestDefinition = ast.FunctionDef | ast.AsyncFunctionDef


def test_definitions(module: ast.Module) -> Iterator[tuple[str, TestDefinition]]:
    """``(key, definition)`` of each test function pytest collects, in the file's order."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in module.body:
        if isinstance(node, functions) and node.name.startswith("test"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and _collected(node):
            for item in node.body:
                if isinstance(item, functions) and item.name.startswith("test"):
                    yield f"{node.name}::{item.name}", item


@kept_with_tests
def first_test(tests: PytestTests) -> PytestTests:
    first, *others = names_of(tests).functions
    if not others:
        return tests
    module = parse_problem_code(tests.test_file, "test_file")
    left_out = {id(node) for key, node in test_definitions(module) if key != first}
    module.body = [node for node in module.body if id(node) not in left_out]
    for node in module.body:
        if isinstance(node, ast.ClassDef):
            node.body = [item for item in node.body if id(item) not in left_out] or [ast.Pass()]
    return tests.model_copy(update={"test_file": ast.unparse(module)})


def _collected(node: ast.ClassDef) -> bool:
    bases = {
        base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases
    }
    if "TestCase" in bases:
        return True
    has_init = any(
        isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body
    )
    return node.name.startswith("Test") and not has_init


def bound_names(module: ast.Module) -> frozenset[str]:
    """The names a module binds at its top level (imports, definitions, assignments): the
    judge never lets ``from solution import *`` replace one of them."""
    names: set[str] = set()
    for statement in module.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            for alias in statement.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
        else:
            names.update(
                node.id
                for node in ast.walk(statement)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
            )
    return frozenset(names)


def imported_names(module: ast.Module, program: str) -> tuple[str, ...]:
    """The names a test file imports from the program's module (``from solution import f``)."""
    return tuple(
        alias.name
        for statement in module.body
        if isinstance(statement, ast.ImportFrom) and statement.module == program
        for alias in statement.names
        if alias.name != "*"
    )
