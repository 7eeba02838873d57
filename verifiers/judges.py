"""Problems -> sandbox jobs: each problem's test form builds its job and judge (``forms``).

All test code and expected values stay trusted: they run in the judge, never in the candidate
program's process, and expected output never enters the sandbox with the program.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..sandbox import ValueCase
from .forms import form_of
from .python_ast import parse_python

if TYPE_CHECKING:
    from ..sandbox import Job, Limits
    from .problems import Problem

_NAME_CHARS = 100
T = TypeVar("T")


def build_job(problem: Problem, program: str, limits: Limits, *, all_cases: bool = True) -> Job:
    """The sandbox job of a problem; ``all_cases=False`` (a binary reward) lets it stop at
    the first case that crashed or hit a limit."""
    return form_of(problem).build_job(problem, program, limits, all_cases=all_cases)


def short_name(source: str) -> str:
    """A test's name in a verdict: its first line, clipped."""
    first = source.strip().splitlines()[0]
    return first if len(first) <= _NAME_CHARS else first[: _NAME_CHARS - 3] + "..."


def longest_first(items: Sequence[T], count: int, size: Callable[[T], int]) -> tuple[T, ...]:
    """The ``count`` items of largest ``size`` (ties: the earlier), in their own order: a cap
    on the tests of a training reward that keeps the ones most likely to fail (rllm's
    ``check_correctness`` keeps the longest inputs)."""
    chosen = sorted(range(len(items)), key=lambda i: (-size(items[i]), i))[:count]
    return tuple(items[i] for i in sorted(chosen))


def value_case(source: str, callee: str) -> ValueCase | None:
    """A test, one statement, as plain data (``JudgeSpec.values``) when it is one:
    ``assert callee(<literals>) == <literal>`` or ``assert <literal>``, its message a string
    literal if it has one. None for any other test, which runs in the judge."""
    body = parse_python(source).body
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    test, message = body[0].test, body[0].msg
    if message is not None and not (
        isinstance(message, ast.Constant) and isinstance(message.value, str)
    ):
        return None
    if any(isinstance(node, ast.Constant) and node.value is ... for node in ast.walk(test)):
        return None  # a literal the codec does not carry
    text = None if message is None else str(message.value)
    try:
        if not isinstance(test, ast.Compare):
            return ValueCase(None, ast.literal_eval(test), text)
        call = test.left
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == callee
            and not call.keywords
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
        ):
            arguments = tuple(ast.literal_eval(argument) for argument in call.args)
            return ValueCase(arguments, ast.literal_eval(test.comparators[0]), text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass  # not literals (``3 * 19``, ``{[1]}``): the judge evaluates them
    return None


def value_cases(sources: Iterable[str], callee: str) -> tuple[ValueCase, ...] | None:
    """Every test as plain data (``value_case``), or None when any one is not: a job's tests
    go to the judge together or not at all."""
    cases = []
    for source in sources:
        case = value_case(source, callee)
        if case is None:
            return None
        cases.append(case)
    return tuple(cases)
