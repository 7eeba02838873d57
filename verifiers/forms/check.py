"""``check``: HumanEval's test module, whose ``check(candidate)`` asserts against the entry point.

All test code stays trusted: helpers the tests call (``poly``, ``encode_cyclic``) come from the
problem's own prompt, run in the judge, never from the candidate program.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Literal

from ...sandbox import Job, JudgeSpec, Limits, ValueCase
from ..extraction import prompt_code
from ..judges import may_rebind, short_name, value_cases
from ..python_ast import is_docstring, parse_problem_code, statement_source
from . import FormTests, JudgedForm, kept_with_tests, register

if TYPE_CHECKING:
    from ..problems import Problem


class CheckTests(FormTests):
    form: Literal["check"] = "check"
    test: str  # a module defining check(candidate)

    def count(self) -> int:
        return len(checks_of(self))

    def public(self) -> CheckTests:
        """``check(candidate)`` up to its first assert (with the statements that set it up),
        the rest of the module (imports, helpers, METADATA) as it is."""
        return first_check(self)

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        return (("Test", checks_of(self)[index][1].strip()),)


class CheckForm(JudgedForm):
    tests_model = CheckTests
    marker = "test"

    def validate(self, problem: Problem) -> None:
        if not problem.entry_point:
            raise ValueError("a HumanEval-style test needs an entry_point")
        checks_of(problem.tests)  # type: ignore[arg-type]  # ValueError naming what is wrong

    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        return Job(program=program, judge=check_judge(problem), limits=limits)


register(CheckForm())


def check_body(test: str) -> list[ast.stmt]:
    """The statements of ``check(candidate)`` in a HumanEval test module."""
    try:
        module = parse_problem_code(test, "test")
    except SyntaxError as exc:
        raise ValueError(f"test is not valid Python: {exc.msg} (line {exc.lineno})") from None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            if [arg.arg for arg in node.args.args] != ["candidate"]:
                raise ValueError("test: check must take exactly one argument, candidate")
            body = node.body
            if body and is_docstring(body[0]):
                body = body[1:]
            if not body:
                raise ValueError("test: check(candidate) has no statements")
            return body
    raise ValueError("test does not define check(candidate)")


def check_judge(problem: Problem) -> JudgeSpec:
    """HumanEval: the trusted prompt's code and test module, then ``check``'s body, one test
    per assert.

    Tests that name the entry point directly (HumanEval/33 calls ``sort_third``) get the
    candidate's too, as in the original harness.
    """
    setup = (
        f"{prompt_code(problem)}\n\n{problem.test}\n\n"
        f"candidate = {problem.entry_point} = __remote__({problem.entry_point!r})\n"
    )
    tests = checks_of(problem.tests)  # type: ignore[arg-type]
    values = values_of(problem.tests)  # type: ignore[arg-type]
    if values and any(case.compare == "close" for case in values) and may_rebind(setup, {"abs"}):
        values = None  # its `abs` may be the setup's, which value tests do not run
    return JudgeSpec(
        setup=setup,
        tests=tuple(source for _, source in tests),
        test_names=tuple(name for name, _ in tests),
        target=problem.entry_point or "",
        values=values,
    )


@kept_with_tests
def values_of(tests: CheckTests) -> tuple[ValueCase, ...] | None:
    """``check``'s tests as plain data, when every one of them is (146 of HumanEval's 164
    problems): the job then needs no judge process."""
    return value_cases((source for _, source in checks_of(tests)), "candidate")


@kept_with_tests
def checks_of(tests: CheckTests) -> tuple[tuple[str, str], ...]:
    return split_check(tests.test)


@kept_with_tests
def first_check(tests: CheckTests) -> CheckTests:
    module = parse_problem_code(tests.test, "test")
    check = next(
        node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == "check"
    )
    first = next(
        (
            index
            for index, statement in enumerate(check.body)
            if any(isinstance(node, ast.Assert) for node in ast.walk(statement))
        ),
        None,
    )
    if first is None or first == len(check.body) - 1:  # one test: the module as it is
        return tests
    check.body = check.body[: first + 1]
    return tests.model_copy(update={"test": ast.unparse(module)})


def split_check(test: str) -> tuple[tuple[str, str], ...]:
    """``(name, source)`` per test of ``check(candidate)``'s body, run at the judge's top level.

    Each top-level statement holding an ``assert`` ends a test; statements without one (setup
    like ``import math`` or ``lst = ...``) run first as part of the next test, and trailing
    ones join the last test, so the whole body runs in order.
    """
    tests: list[tuple[str, str]] = []
    pending: list[str] = []
    # Offsets count lines at each "\n" alone only where no "\r" ends one too.
    lines = test.split("\n") if "\r" not in test else None
    for statement in check_body(test):
        pending.append(
            statement_source(lines, statement) if lines is not None else ast.unparse(statement)
        )
        if any(isinstance(node, ast.Assert) for node in ast.walk(statement)):
            tests.append((short_name(pending[-1]), "\n".join(pending) + "\n"))
            pending = []
    if pending and tests:
        name, source = tests.pop()
        tests.append((name, source + "\n".join(pending) + "\n"))
    elif pending:
        tests.append((short_name(pending[0]), "\n".join(pending) + "\n"))
    return tuple(tests)
