"""Intervals and paired tests of ``pipeline.stats`` against values computed by hand, and the
size of the paired test of sampled runs under a simulated null."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import product
from statistics import NormalDist

import pytest
from benchmark_scripts import load

from codepost.pipeline.reporting import stats
from codepost.pipeline.reporting.stats import (
    RESAMPLES,
    bootstrap_interval,
    compare_greedy,
    compare_sampled,
    sign_flip_p_value,
    wilson_interval,
)
from codepost.verifiers import exact_pass_at_k

simulation = load("paired_test_size")


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


def test_the_paired_comparison_sees_a_consistent_improvement_and_no_phantom_one():
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


def sign_flip_by_hand(differences: list[Fraction]) -> float:
    """Every sign pattern of every difference, zeros included, in exact arithmetic."""
    observed = abs(sum(differences))
    sums = [
        sum(sign * d for sign, d in zip(signs, differences, strict=True))
        for signs in product((1, -1), repeat=len(differences))
    ]
    return sum(abs(total) >= observed for total in sums) / len(sums)


def counts(passed: list[int], n: int = 8) -> dict[str, tuple[int, int]]:
    return {f"t{i}": (n, c) for i, c in enumerate(passed)}


@pytest.mark.parametrize(
    ("before", "after", "n", "k"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 2], [1, 1, 4, 2, 4, 7, 6, 8, 5, 0], 8, 1),  # ties, zeros
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 2], [1, 1, 4, 2, 4, 7, 6, 8, 5, 0], 8, 3),  # pass@3
        # C(200, 100) ~ 9e58: off int64, the differences go on a coarser grid
        ([3, 3, 3, 0, 150, 1], [1, 1, 1, 2, 140, 0], 200, 100),
    ],
)
def test_the_sign_flip_test_counts_every_sign_pattern(before, after, n, k):
    differences = [
        exact_pass_at_k(n, a, k) - exact_pass_at_k(n, b, k)
        for b, a in zip(before, after, strict=True)
    ]
    by_hand = sign_flip_by_hand(differences)
    assert sign_flip_p_value(differences) == by_hand
    assert compare_sampled(counts(before, n), counts(after, n), k).p_value == by_hand


# Passes of 8 samples on each of the 7 problems of round 2's first attempt, from the table in
# docs/learning-mbpp-2/first-attempt/README.md (666, 708, 800, 807, 821, 945, 970).
FIRST_ATTEMPT = {
    "SFT 1": [3, 0, 2, 0, 0, 1, 2],
    "SFT 2": [3, 0, 2, 2, 0, 2, 5],
    "GRPO": [2, 1, 2, 0, 0, 2, 6],
    "RFT": [4, 6, 5, 6, 0, 1, 8],
}


@pytest.mark.parametrize(
    ("a", "b", "difference", "p_value"),
    [
        # one checkpoint evaluated twice: the bootstrap said p = 0.04; three problems differ
        # (+2, +1, +3 passes), all the same way: 2 of the 2**3 sign patterns
        ("SFT 1", "SFT 2", 3 / 28, 2 / 2**3),
        ("SFT 2", "GRPO", -1 / 56, 16 / 2**4),  # -1, +1, -2, +1: every pattern as far from 0
        ("SFT 1", "GRPO", 5 / 56, 8 / 2**4),
        ("SFT 2", "RFT", 16 / 56, 6 / 2**6),
        ("SFT 1", "RFT", 22 / 56, 2 / 2**5),  # five gains, none lost: the floor at 5 problems
        ("RFT", "GRPO", -17 / 56, 4 / 2**6),
    ],
)
def test_the_first_attempts_comparisons_by_the_sign_flip_test(a, b, difference, p_value):
    """The numbers its README gives beside the bootstrap's (0.04, 0.88, 0.13, 0.007, 0.0006,
    0.006): problems that did not move carry no sign, and none of these is below 0.05."""
    result = compare_sampled(counts(FIRST_ATTEMPT[a]), counts(FIRST_ATTEMPT[b]), 1)
    assert result.difference == pytest.approx(difference)
    assert result.p_value == p_value


def test_sign_flip_edge_cases_never_give_p_zero():
    # one problem: flipping its sign gives the same |difference|
    assert compare_sampled(counts([0]), counts([8]), 1).p_value == 1.0
    # the same gain on every problem: only the observed pattern and its mirror are as extreme
    assert compare_sampled(counts([1] * 5), counts([4] * 5), 1).p_value == 2 / 2**5
    assert compare_sampled(counts([1] * 20), counts([4] * 20), 1).p_value == 2 / 2**20
    # past 20 non-zero differences: random patterns, the observed one counted in
    assert compare_sampled(counts([1] * 30), counts([4] * 30), 1).p_value == 1 / (RESAMPLES + 1)
    # every difference zero, though the counts differ: pass@4 is 1 where n - c < 4
    same = compare_sampled(counts([5, 6, 7]), counts([6, 7, 8]), 4)
    assert (same.difference, same.p_value) == (0.0, 1.0)
    assert sign_flip_p_value([]) == 1.0


def test_random_sign_patterns_estimate_the_exact_p(monkeypatch):
    differences = [Fraction(c, 8) for c in (3, -1, 2, 2, -2, 1, 4, -1, 1, 2, -3, 1)]
    exact = sign_flip_p_value(differences)
    assert exact == sign_flip_by_hand(differences)
    monkeypatch.setattr(stats, "SIGN_FLIP_EXACT_UP_TO", 0)
    sampled = sign_flip_p_value(differences, seed=3)
    assert sampled == sign_flip_p_value(differences, seed=3)  # seeded: the same p every time
    assert abs(sampled - exact) < 4 * math.sqrt(exact * (1 - exact) / RESAMPLES)


NULL_PAIRS = 500  # simulated pairs of evaluations per size: 3 s.e. of a 5% rate is 0.029
ALPHA = 0.05


@pytest.mark.parametrize("problems", [5, 25, 100])
def test_the_paired_test_rejects_a_true_null_at_most_alpha_of_the_time(problems):
    """Both checkpoints draw from the same per-problem pass probabilities; the rate of p < 0.05
    stays within 3 Monte-Carlo standard errors of 0.05 (seeded: the same pairs every run)."""
    rate = simulation.rejection_rate(simulation.sign_flip, problems, NULL_PAIRS, alpha=ALPHA)
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / NULL_PAIRS)


def test_the_size_check_catches_the_percentile_bootstrap_it_replaced():
    rate = simulation.rejection_rate(simulation.percentile_bootstrap, 5, NULL_PAIRS, alpha=ALPHA)
    assert rate > ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / NULL_PAIRS)


def test_the_paired_test_detects_a_real_difference():
    """+0.15 on every problem's pass probability, 25 problems of 8 samples: found in most
    pairs. At 5 problems nothing can be: the smallest p is 2/2**5 > 0.05."""
    rate = simulation.rejection_rate(simulation.sign_flip, 25, 200, lift=0.15, alpha=ALPHA)
    assert rate >= 0.7
    assert simulation.rejection_rate(simulation.sign_flip, 5, 200, lift=0.5, alpha=ALPHA) == 0
