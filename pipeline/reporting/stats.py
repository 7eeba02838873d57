"""Intervals and paired tests for evaluations: how sure a pass@k is, and whether two checkpoints
evaluated on the same problems differ by more than chance.

- greedy pass@1 is a binomial proportion: a Wilson score interval, and for two checkpoints on
  the same problems the exact McNemar test on the discordant problems (solved by one only);
- sampled pass@k is a mean over problems of the unbiased estimator: a percentile bootstrap over
  problems, and for two checkpoints a paired bootstrap of the per-problem differences.

Problems, not samples, are the unit resampled: samples of one problem are not independent.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from ...verifiers import estimate_pass_at_k

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000

Interval = tuple[float, float]


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
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of the mean of per-problem ``values`` (problems resampled
    with replacement)."""
    means = _bootstrap_means(np.array(list(values.values()), dtype=float), resamples, seed)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


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
    p_value: float  # paired bootstrap, two-sided


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
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> SampledComparison:
    """Paired bootstrap: resample problems, the same draw for both checkpoints, and look at the
    distribution of the difference in mean pass@k."""
    tasks = _same_problems(before, after)
    b = pass_at_k_per_problem({t: before[t] for t in tasks}, k)
    a = pass_at_k_per_problem({t: after[t] for t in tasks}, k)
    differences = np.array([a[t] - b[t] for t in tasks], dtype=float)
    means = _bootstrap_means(differences, resamples, seed)
    alpha = (1 - CONFIDENCE) / 2
    p_value = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    if not differences.any():
        p_value = 1.0
    return SampledComparison(
        k=k,
        problems=len(tasks),
        before=float(np.mean(list(b.values()))),
        after=float(np.mean(list(a.values()))),
        difference=float(differences.mean()),
        difference_ci95=(float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))),
        p_value=p_value,
    )


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
