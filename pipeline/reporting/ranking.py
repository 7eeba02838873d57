"""How well scores (a reward model's) rank completions the verifier judged, on problems the
scorer never saw: the verifier labels every sample, so a learned reward is measured against
the ground truth it stands in for.

- **Pairwise accuracy**: within one problem, the share of (passing, failing) pairs the scores
  put in the right order, a tie counting half (the problem's AUROC); averaged over problems, so
  each problem weighs the same whatever its number of pairs. The interval is a bootstrap over
  problems, and p is the sign-flip test of the per-problem accuracies against 1/2 (chance).
- **AUROC**: pass against fail over every sample of every problem together, so a score that
  knows which problems are hard gets credit here too; the interval draws problems whole.
- **Calibration**: samples in bins of equal size by score, each bin's pass rate with its
  Wilson interval: whether a higher score means a higher chance of passing, and by how much.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
from pydantic import BaseModel, ConfigDict

from .stats import (
    Interval,
    bootstrap_interval,
    bootstrap_statistic_interval,
    sign_flip_p_value,
    wilson_interval,
)

Scored = tuple[float, bool]  # a sample's score, and whether it passed


def pairwise_accuracy(samples: Sequence[Scored]) -> Fraction | None:
    """The share of one problem's (passing, failing) pairs whose passing sample scores higher,
    a tie counting half; None when the problem lacks a passing or a failing sample."""
    passing = [score for score, passed in samples if passed]
    failing = [score for score, passed in samples if not passed]
    if not passing or not failing:
        return None
    half_wins = sum(2 * (p > f) + (p == f) for p in passing for f in failing)
    return Fraction(half_wins, 2 * len(passing) * len(failing))


def auroc(samples: Sequence[Scored]) -> float:
    """The probability that a passing sample scores above a failing one (ties half); NaN
    without both classes."""
    scores = np.array([score for score, _ in samples], dtype=float)
    return _auroc(scores, np.array([passed for _, passed in samples], dtype=bool))


def _auroc(scores: np.ndarray, passed: np.ndarray) -> float:
    """:func:`auroc` from the average ranks of the scores (Mann-Whitney U)."""
    positives = int(passed.sum())
    negatives = passed.size - positives
    if not positives or not negatives:
        return math.nan
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_ranks = np.cumsum(counts) - (counts - 1) / 2  # ties share their mean rank
    rank_sum = float(average_ranks[inverse][passed].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def _pooled_auroc(problems: list[tuple[np.ndarray, np.ndarray]]) -> float:
    return _auroc(
        np.concatenate([s for s, _ in problems]), np.concatenate([p for _, p in problems])
    )


class CalibrationBin(BaseModel):
    """Samples whose scores lie in ``[score_low, score_high]``, and how many of them passed."""

    model_config = ConfigDict(frozen=True)

    score_low: float
    score_high: float
    samples: int
    passed: int
    pass_rate: float
    pass_rate_ci95: Interval


def calibration(samples: Sequence[Scored], bins: int) -> list[CalibrationBin]:
    """``samples`` sorted by score in ``bins`` bins of (nearly) equal size, lowest first."""
    ordered = sorted(samples)
    bins = min(bins, len(ordered))
    edges = [round(i * len(ordered) / bins) for i in range(bins + 1)]
    table = []
    for start, stop in itertools.pairwise(edges):
        chunk = ordered[start:stop]
        passed = sum(p for _, p in chunk)
        table.append(
            CalibrationBin(
                score_low=chunk[0][0],
                score_high=chunk[-1][0],
                samples=len(chunk),
                passed=passed,
                pass_rate=passed / len(chunk),
                pass_rate_ci95=wilson_interval(passed, len(chunk)),
            )
        )
    return table


class RankingQuality(BaseModel):
    """A scorer's ranking of verified samples, on problems it never trained on."""

    model_config = ConfigDict(frozen=True)

    problems: int
    samples: int
    passed: int
    problems_with_pairs: int  # with a passing and a failing sample
    pairs: int  # (passing, failing) pairs within those problems
    pairwise_accuracy: float  # the mean over problems_with_pairs
    pairwise_accuracy_ci95: Interval
    pairwise_p_value: float  # against 1/2, sign-flip test over problems
    auroc: float  # pass against fail, every sample pooled
    auroc_ci95: Interval
    calibration: list[CalibrationBin]


def ranking_quality(
    samples: Mapping[str, Sequence[Scored]], bins: int = 5, seed: int = 0
) -> RankingQuality:
    """Pairwise accuracy, AUROC and calibration of the scored ``samples`` of each problem;
    ValueError when no problem has both a passing and a failing sample (nothing to rank)."""
    accuracies = {
        task: accuracy
        for task, scored in samples.items()
        if (accuracy := pairwise_accuracy(scored)) is not None
    }
    if not accuracies:
        raise ValueError(
            f"none of the {len(samples)} problems has both a passing and a failing sample: "
            "there is no ranking to measure"
        )
    pooled = [sample for scored in samples.values() for sample in scored]
    counts = {task: [sum(p for _, p in samples[task]), len(samples[task])] for task in accuracies}
    return RankingQuality(
        problems=len(samples),
        samples=len(pooled),
        passed=sum(p for _, p in pooled),
        problems_with_pairs=len(accuracies),
        pairs=sum(passed * (n - passed) for passed, n in counts.values()),
        pairwise_accuracy=float(sum(accuracies.values()) / len(accuracies)),
        pairwise_accuracy_ci95=bootstrap_interval(
            {task: float(accuracy) for task, accuracy in accuracies.items()}, seed=seed
        ),
        pairwise_p_value=sign_flip_p_value(
            [accuracy - Fraction(1, 2) for accuracy in accuracies.values()], seed=seed
        ),
        auroc=auroc(pooled),
        auroc_ci95=bootstrap_statistic_interval(
            {
                task: (
                    np.array([s for s, _ in scored], dtype=float),
                    np.array([p for _, p in scored], dtype=bool),
                )
                for task, scored in samples.items()
            },
            _pooled_auroc,
            seed=seed,
        ),
        calibration=calibration(pooled, bins),
    )
