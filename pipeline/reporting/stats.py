"""Intervals and paired tests for evaluations: how sure a pass@k is, and whether two checkpoints
evaluated on the same problems differ by more than chance.

- greedy pass@1 is a binomial proportion: a Wilson score interval, and for two checkpoints on
  the same problems the exact McNemar test on the discordant problems (solved by one only);
- sampled pass@k is a mean over problems of the unbiased estimator: a percentile bootstrap over
  problems for its interval, and for two checkpoints the sign-flip (randomization) test of the
  per-problem differences for p, with a paired bootstrap for the difference's interval.

Problems, not samples, are the unit resampled: samples of one problem are not independent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from ...verifiers import estimate_pass_at_k, exact_pass_at_k

CONFIDENCE = 0.95
RESAMPLES = 10_000  # bootstrap draws, and random sign patterns past the exact limit
SIGN_FLIP_EXACT_UP_TO = 20  # non-zero differences: all 2**20 sign patterns, in 8 MiB
_SUM_ROOM = 2**62  # every signed sum of the differences, on their integer grid, fits in int64

Interval = tuple[float, float]
T = TypeVar("T")


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval of ``successes`` out of ``n`` (well behaved at 0 and n, where
    the normal approximation collapses to a point)."""
    from scipy.stats import binomtest  # a second of start-up: loaded when used

    if not 0 <= successes <= n or n == 0:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes} of {n}")
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def pass_at_k_per_problem(counts: Mapping[str, tuple[int, int]], k: int) -> dict[str, float]:
    """The unbiased pass@k estimate of each problem from its (samples, correct) counts."""
    return {task: estimate_pass_at_k(n, c, k) for task, (n, c) in counts.items()}


def bootstrap_interval(
    values: Mapping[str, float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of the mean of per-problem ``values`` (problems resampled
    with replacement)."""
    means = _bootstrap_means(np.array(list(values.values()), dtype=float), resamples, seed)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


def bootstrap_statistic_interval(
    values: Mapping[str, T],
    statistic: Callable[[list[T]], float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of ``statistic`` of the problems' ``values``, problems drawn
    whole with replacement: for a statistic that pools the samples of many problems (an AUROC),
    where :func:`bootstrap_interval`'s mean of one value per problem does not apply. Draws where
    the statistic is undefined (NaN: one class missing) are left out."""
    data = list(values.values())
    if not data:
        raise ValueError("no problems to resample")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(data), size=(resamples, len(data)))
    stats = np.array([statistic([data[i] for i in draw]) for draw in draws])
    stats = stats[~np.isnan(stats)]
    if stats.size == 0:
        return (math.nan, math.nan)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))


class GreedyComparison(BaseModel):
    """Greedy pass@1 of ``after`` against ``before`` on the same problems."""

    model_config = ConfigDict(frozen=True)

    problems: int
    before_passed: int
    after_passed: int
    gained: int  # failed before, pass after
    lost: int  # passed before, fail after
    difference: float  # pass@1 after - before
    p_value: float  # exact McNemar (two-sided binomial test on gained vs lost)


class SampledComparison(BaseModel):
    """Sampled pass@k of ``after`` against ``before`` on the same problems."""

    model_config = ConfigDict(frozen=True)

    k: int
    problems: int
    before: float
    after: float
    difference: float
    difference_ci95: Interval
    p_value: float  # sign-flip test over problems, two-sided


def compare_greedy(before: Mapping[str, bool], after: Mapping[str, bool]) -> GreedyComparison:
    """Exact McNemar test: under no difference, a discordant problem is as likely to be gained
    as lost, so ``gained`` ~ Binomial(gained + lost, 1/2)."""
    from scipy.stats import binomtest

    tasks = _same_problems(before, after)
    gained = sum(after[t] and not before[t] for t in tasks)
    lost = sum(before[t] and not after[t] for t in tasks)
    discordant = gained + lost
    p_value = binomtest(gained, discordant, 0.5).pvalue if discordant else 1.0
    before_passed = sum(bool(before[t]) for t in tasks)
    after_passed = sum(bool(after[t]) for t in tasks)
    return GreedyComparison(
        problems=len(tasks),
        before_passed=before_passed,
        after_passed=after_passed,
        gained=gained,
        lost=lost,
        difference=(after_passed - before_passed) / len(tasks),
        p_value=float(p_value),
    )


def compare_sampled(
    before: Mapping[str, tuple[int, int]],
    after: Mapping[str, tuple[int, int]],
    k: int,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> SampledComparison:
    """The difference in mean pass@k: p from the sign-flip test of the per-problem differences
    (right at any number of problems, where a bootstrap p is too small), the interval from a
    paired bootstrap (problems resampled, the same draw for both checkpoints)."""
    tasks = _same_problems(before, after)
    b = [exact_pass_at_k(*before[t], k) for t in tasks]
    a = [exact_pass_at_k(*after[t], k) for t in tasks]
    differences = [x - y for x, y in zip(a, b, strict=True)]
    return SampledComparison(
        k=k,
        problems=len(tasks),
        before=float(sum(b) / len(tasks)),
        after=float(sum(a) / len(tasks)),
        difference=float(sum(differences) / len(tasks)),
        difference_ci95=bootstrap_interval(
            dict(zip(tasks, map(float, differences), strict=True)),
            resamples=resamples,
            seed=seed,
        ),
        p_value=sign_flip_p_value(differences, resamples=resamples, seed=seed),
    )


def sign_flip_p_value(
    differences: Sequence[Fraction], *, resamples: int = RESAMPLES, seed: int = 0
) -> float:
    """Two-sided p of a zero mean difference. Under no difference each problem's difference is
    as likely negative as positive, so |sum| is ranked among its values under sign patterns:
    all of them up to ``SIGN_FLIP_EXACT_UP_TO`` non-zero differences (p >= 2 / 2**m), else
    ``resamples`` random ones with the observed counted in (p >= 1 / (resamples + 1)). Its
    size is at most alpha at any number of problems; zeros carry no sign and are left out."""
    grid = _on_integer_grid([d for d in differences if d])
    if grid.size == 0:
        return 1.0
    observed = abs(int(grid.sum()))
    if grid.size <= SIGN_FLIP_EXACT_UP_TO:
        sums = np.zeros(1, dtype=np.int64)
        for value in grid:
            sums = np.concatenate([sums + value, sums - value])
        return int(np.count_nonzero(np.abs(sums) >= observed)) / sums.size
    rng = np.random.default_rng(seed)
    as_extreme = 0
    for start in range(0, resamples, 1_000):  # 1,000 patterns at a time bound the memory
        signs = 2 * rng.integers(0, 2, size=(min(1_000, resamples - start), grid.size)) - 1
        as_extreme += int(np.count_nonzero(np.abs(signs @ grid) >= observed))
    return (1 + as_extreme) / (resamples + 1)


def _on_integer_grid(differences: list[Fraction]) -> np.ndarray:
    """The differences as int64 multiples of one step, so that signed sums tie exactly: the
    step is their common denominator (1/n for pass@1) where every sum fits, else the finest
    step that keeps them in int64 (pass@k with large n and k; ties may then be lost)."""
    if not differences:
        return np.zeros(0, dtype=np.int64)
    total = sum(abs(d) for d in differences)
    scale = math.lcm(*(d.denominator for d in differences))
    if total * scale >= _SUM_ROOM:
        scale = math.floor(_SUM_ROOM / total)
    return np.array([round(d * scale) for d in differences], dtype=np.int64)


def _bootstrap_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    if values.size == 0:
        raise ValueError("no problems to resample")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, values.size, size=(resamples, values.size))
    return values[draws].mean(axis=1)


def _same_problems(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The shared task ids; a paired test on different problem sets would be meaningless."""
    if set(before) != set(after):
        only_before, only_after = set(before) - set(after), set(after) - set(before)
        raise ValueError(
            "a paired comparison needs the same problems: "
            f"{len(only_before)} only in the first (e.g. {sorted(only_before)[:3]}), "
            f"{len(only_after)} only in the second (e.g. {sorted(only_after)[:3]})"
        )
    if not before:
        raise ValueError("no problems to compare")
    return sorted(before)
