"""Intervals and paired tests of ``pipeline.stats`` against values computed by hand."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from codepost.pipeline.reporting.stats import (
    bootstrap_interval,
    compare_greedy,
    compare_sampled,
    wilson_interval,
)


def wilson_by_formula(successes: int, n: int) -> tuple[float, float]:
    """The textbook Wilson score interval at 95%."""
    z = NormalDist().inv_cdf(0.975)
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return center - half, center + half


@pytest.mark.parametrize(("successes", "n"), [(3, 32), (0, 10), (10, 10), (82, 164)])
def test_wilson_interval_matches_the_formula(successes, n):
    assert wilson_interval(successes, n) == pytest.approx(wilson_by_formula(successes, n))


def test_wilson_interval_published_value_and_bounds():
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12)
    assert round(high, 4) == 0.2775  # the published 95% upper bound for 0 of 10
    low, high = wilson_interval(10, 10)
    assert round(low, 4) == 0.7225 and high == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(1, 0)


def outcomes(passed: set[int], problems: int = 20) -> dict[str, bool]:
    return {f"t{i}": i in passed for i in range(problems)}


def test_mcnemar_is_the_exact_binomial_sum_over_discordant_problems():
    before = outcomes({0, 1, 2, 3})
    after = outcomes({0, 1, 2, *range(4, 11)})  # gains 4..10, loses 3
    result = compare_greedy(before, after)
    assert (result.gained, result.lost) == (7, 1)
    assert (result.before_passed, result.after_passed, result.problems) == (4, 10, 20)
    assert result.difference == pytest.approx(0.3)
    by_hand = 2 * sum(math.comb(8, i) for i in range(2)) / 2**8
    assert by_hand == 0.0703125
    assert result.p_value == pytest.approx(by_hand)
    assert compare_greedy(after, before).p_value == pytest.approx(by_hand)  # two-sided


def test_mcnemar_without_evidence_gives_p_one():
    balanced = compare_greedy(outcomes({0, 1, 2}), outcomes({0, 3, 4}))  # +2 / -2
    assert (balanced.gained, balanced.lost, balanced.p_value) == (2, 2, 1.0)
    same = compare_greedy(outcomes({0, 1}), outcomes({0, 1}))  # no discordant problem
    assert (same.gained, same.lost, same.p_value, same.difference) == (0, 0, 1.0, 0.0)


def test_bootstrap_interval_holds_the_mean_and_shrinks_with_more_problems():
    few = {f"t{i}": float(i % 3 == 0) for i in range(30)}
    many = {f"t{i}": float(i % 3 == 0) for i in range(300)}
    widths = []
    for values in (few, many):
        low, high = bootstrap_interval(values)
        mean = sum(values.values()) / len(values)
        assert low < mean < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2  # about 1/sqrt(10) as wide


def test_paired_bootstrap_sees_a_consistent_improvement_and_no_phantom_one():
    before = {f"t{i}": (10, 1 + i % 6) for i in range(100)}
    # one more correct sample on 9 problems in 10, one fewer on the tenth
    better = {t: (n, c + 1 if i % 10 else c - 1) for i, (t, (n, c)) in enumerate(before.items())}
    improved = compare_sampled(before, better, k=1)
    assert improved.difference == pytest.approx(0.08)
    assert improved.p_value < 0.05 and improved.difference_ci95[0] > 0
    assert improved.after == pytest.approx(improved.before + improved.difference)
    # one more on half the problems, one fewer on the other half: no difference on average
    noise = {t: (n, c + 1 if i % 2 else c - 1) for i, (t, (n, c)) in enumerate(before.items())}
    unchanged = compare_sampled(before, noise, k=1)
    assert unchanged.difference == pytest.approx(0.0, abs=1e-12)
    assert unchanged.p_value > 0.05
    assert unchanged.difference_ci95[0] < 0 < unchanged.difference_ci95[1]
    assert compare_sampled(before, before, k=4).p_value == 1.0


def test_different_problem_sets_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"only in the first \(e\.g\. \['t2'\]\).*\['t9'\]"):
        compare_greedy({"t1": True, "t2": False}, {"t1": True, "t9": True})
    with pytest.raises(ValueError, match="same problems"):
        compare_sampled({"t1": (4, 1)}, {"t2": (4, 1)}, k=1)
