"""``asserts``: MBPP's assert lines (with optional ``test_setup_code`` and ``test_imports``)."""

from __future__ import annotations

import ast
import builtins
import sys
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from ...sandbox import Job, JudgeSpec, Limits, ValueCase
from ..extraction import import_lines
from ..judges import longest_first, may_rebind, short_name, value_cases
from ..python_ast import check_code_length, parse_problem_code, parse_python
from . import FormTests, JudgedForm, kept_with_tests, register

if TYPE_CHECKING:
    from ..problems import Problem


class AssertsTests(FormTests):
    form: Literal["asserts"] = "asserts"
    test_list: tuple[str, ...]
    test_setup_code: str = ""  # MBPP: runs after the solution, in the program's process
    test_imports: tuple[str, ...] = ()  # import lines the asserts need, run by the judge

    @field_validator("test_list")
    @classmethod
    def _asserts_parse(cls, tests: tuple[str, ...]) -> tuple[str, ...]:
        for index, line in enumerate(tests):
            if not line.strip():
                raise ValueError(f"test {index} is blank")
            try:
                parse_problem_code(line, f"test {index}")
            except SyntaxError as exc:
                raise ValueError(
                    f"test {index} is not valid Python ({exc.msg}): {line!r}"
                ) from None
        return tests

    @field_validator("test_setup_code", "test_imports")
    @classmethod
    def _code_within_bounds(cls, code: str | tuple[str, ...], info: ValidationInfo) -> Any:
        # parsed for their imports as each sample's judge is built
        check_code_length("".join(code), str(info.field_name))
        return code

    @model_validator(mode="after")
    def _not_empty(self) -> AssertsTests:
        if not self.test_list:
            raise ValueError("test_list is empty")
        return self

    def count(self) -> int:
        return len(self.test_list)

    def capped(self, max_tests: int) -> AssertsTests:
        kept = longest_first(self.test_list, max_tests, len)
        return self.model_copy(update={"test_list": kept})

    def public(self) -> AssertsTests:
        """The first assert: MBPP's prompt shows it already."""
        return self.model_copy(update={"test_list": self.test_list[:1]})

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        return (("Test", self.test_list[index].strip()),)


class AssertsForm(JudgedForm):
    tests_model = AssertsTests
    marker = "test_list"

    def instructions(self, problem: Problem) -> list[str]:
        return [f"Your code should pass this test:\n{problem.test_list[0]}"]

    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        # MBPP's setup code builds inputs from the solution's own classes (tasks 367, 927 set
        # attributes on Node objects, which judge-side references cannot do), so it runs in the
        # program's process, after the solution; the judge sees the results as program names.
        if problem.test_setup_code.strip():
            program = f"{program.rstrip()}\n\n{problem.test_setup_code}\n"
        return Job(program=program, judge=asserts_judge(problem), limits=limits)


register(AssertsForm())


@kept_with_tests
def names_of(tests: AssertsTests) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    return names_in(tests.test_list)


def names_in(tests: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The names the asserts read, the names they call, and the names they take attributes of."""
    used: set[str] = set()
    called: set[str] = set()
    modules: set[str] = set()
    for line in tests:
        for node in ast.walk(parse_python(line)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                modules.add(node.value.id)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
    return frozenset(used), frozenset(called), frozenset(modules)


def asserts_judge(problem: Problem) -> JudgeSpec:
    """MBPP: the names the asserts use, bound in the judge, then one test per assert.

    A stdlib module the asserts use as ``module.attr`` is imported by the judge (sanitized
    MBPP/596 calls ``sys.getsizeof`` and relied on the solution importing ``sys``). Other names
    come from the program, private ones too (MBPP/798 asks for ``_sum``), except builtins: a
    program that defines ``set`` or ``abs`` must not change what ``set(f(x)) == set(...)`` or
    ``abs(f(x) - y) < eps`` compares. A builtin comes from the program only when it is the
    explicit entry point, or when the asserts use no name but builtins, so that the builtins
    they call are what they test (MBPP/126 asks for a function named ``sum``). The test
    imports run last, so they win too.
    """
    tests = tuple(problem.test_list)
    used, called, attributes = names_of(problem.tests)  # type: ignore[arg-type]
    modules = {
        name
        for name in attributes & set(sys.stdlib_module_names)
        if name != problem.entry_point and not hasattr(builtins, name)
    }
    names = {name for name in used - modules if not hasattr(builtins, name)}
    if problem.entry_point in used:
        names.add(problem.entry_point)
    elif not names and not problem.entry_point:
        names = set(called)
    from_program = sorted(names)
    own_imports = "".join(line.rstrip() + "\n" for line in problem.test_imports) + import_lines(
        problem.test_setup_code
    )
    setup = (
        "".join(f"import {name}\n" for name in sorted(modules))
        + f"for __name in {from_program!r}:\n"
        "    try:\n"
        "        globals()[__name] = __remote__(__name)\n"
        "    except NameError:\n"
        "        pass  # a test that uses it fails, naming it\n" + own_imports
    )
    values = values_of(problem.tests)  # type: ignore[arg-type]
    target, cases = values if values and values[0] in names else ("", None)
    if cases is not None and may_rebind(own_imports, {target}):
        target, cases = "", None  # its target may be the imports', which values skip
    return JudgeSpec(
        setup=setup,
        tests=tuple(line.strip() + "\n" for line in tests),
        test_names=tuple(short_name(line) for line in tests),
        target=target,
        values=cases,
    )


@kept_with_tests
def values_of(tests: AssertsTests) -> tuple[str, tuple[ValueCase, ...]] | None:
    """The function the asserts call and the asserts as plain data, when each is
    ``assert f(<literals>) == <literal>`` of that one function (966 of MBPP's 974 problems):
    the job then needs no judge process."""
    _, called, _ = names_of(tests)
    if len(called) != 1:
        return None
    (target,) = called
    cases = value_cases(tests.test_list, target)
    return None if cases is None else (target, cases)
