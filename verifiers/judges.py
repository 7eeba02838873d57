"""Problems -> sandbox jobs: each problem's test form builds its job and judge (``forms``).

All test code and expected values stay trusted: they run in the judge, never in the candidate
program's process, and expected output never enters the sandbox with the program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from .forms import form_of

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
