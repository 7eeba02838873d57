"""Problems -> sandbox jobs, and stdout comparison for stdin/stdout problems.

All test code and expected values stay trusted: HumanEval helpers the tests call (``poly``,
``encode_cyclic``) come from the problem's own prompt run in the judge, never from the
candidate program, and expected stdout never enters the sandbox.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import sys

from ..sandbox import Job, JudgeSpec, Limits
from .extraction import import_lines, prompt_code
from .problems import Problem, check_body
from .python_ast import parse_python

_NAME_CHARS = 100
# An io job's output budget grows by this many bytes per byte its cases expect (trailing
# spaces and CRLF line ends cost bytes), so a problem with several large expected outputs
# does not fail its later cases on a budget the earlier ones used up.
OUTPUT_PER_EXPECTED_BYTE = 2


def build_job(problem: Problem, program: str, limits: Limits, *, all_cases: bool = True) -> Job:
    """The sandbox job of a problem; ``all_cases=False`` (a binary reward) runs no io case
    after one that crashed or hit a limit."""
    if problem.test_form == "io":
        cases = problem.io or ()
        expected = sum(len(case.output.encode()) for case in cases)
        budget = limits.output_bytes + OUTPUT_PER_EXPECTED_BYTE * expected
        return Job(
            program=program,
            stdin_cases=tuple(case.input for case in cases),
            limits=dataclasses.replace(limits, output_bytes=budget),
            stop_at_failure=not all_cases,
        )
    if problem.test_form == "check":
        return Job(program=program, judge=check_judge(problem), limits=limits)
    # MBPP's setup code builds inputs from the solution's own classes (tasks 367, 927 set
    # attributes on Node objects, which judge-side references cannot do), so it runs in the
    # program's process, after the solution; the judge sees the results as program names.
    if problem.test_setup_code.strip():
        program = f"{program.rstrip()}\n\n{problem.test_setup_code}\n"
    return Job(program=program, judge=asserts_judge(problem), limits=limits)


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
    tests = split_check(problem.test or "")
    return JudgeSpec(
        setup=setup,
        tests=tuple(source for _, source in tests),
        test_names=tuple(name for name, _ in tests),
    )


def split_check(test: str) -> list[tuple[str, str]]:
    """``(name, source)`` per test of ``check(candidate)``'s body, run at the judge's top level.

    Each top-level statement holding an ``assert`` ends a test; statements without one (setup
    like ``import math`` or ``lst = ...``) run first as part of the next test, and trailing
    ones join the last test, so the whole body runs in order.
    """
    tests: list[tuple[str, str]] = []
    pending: list[str] = []
    for statement in check_body(test):
        pending.append(ast.unparse(statement))
        if any(isinstance(node, ast.Assert) for node in ast.walk(statement)):
            tests.append((_name(pending[-1]), "\n".join(pending) + "\n"))
            pending = []
    if pending and tests:
        name, source = tests.pop()
        tests.append((name, source + "\n".join(pending) + "\n"))
    elif pending:
        tests.append((_name(pending[0]), "\n".join(pending) + "\n"))
    return tests


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
    tests = tuple(problem.test_list or ())
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
    modules = {
        name
        for name in modules & set(sys.stdlib_module_names)
        if name != problem.entry_point and not hasattr(builtins, name)
    }
    names = {name for name in used - modules if not hasattr(builtins, name)}
    if problem.entry_point in used:
        names.add(problem.entry_point)
    elif not names and not problem.entry_point:
        names = called
    from_program = sorted(names)
    setup = (
        "".join(f"import {name}\n" for name in sorted(modules))
        + f"for __name in {from_program!r}:\n"
        "    try:\n"
        "        globals()[__name] = __remote__(__name)\n"
        "    except NameError:\n"
        "        pass  # a test that uses it fails, naming it\n"
        + "".join(line.rstrip() + "\n" for line in problem.test_imports)
        + import_lines(problem.test_setup_code)
    )
    return JudgeSpec(
        setup=setup,
        tests=tuple(line.strip() + "\n" for line in tests),
        test_names=tuple(_name(line) for line in tests),
    )


def _name(source: str) -> str:
    first = source.strip().splitlines()[0]
    return first if len(first) <= _NAME_CHARS else first[: _NAME_CHARS - 3] + "..."


def normalize_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped (CRLF-safe)."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: str, expected: str) -> bool:
    return normalize_output(actual) == normalize_output(expected)
