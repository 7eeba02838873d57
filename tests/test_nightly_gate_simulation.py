"""The gate over a series, simulated (benchmarks/nightly_gate.py) at a tenth of the size of the
figures docs/nightly.md states: a model that never improves is promoted at most alpha of the
time over 365 nights where the per-night rule promotes it often, a real gain is promoted as
often as stated, a guard stops a real 2.4-point regression as often as stated; and the
simulation's vectorised tests decide as the gate's own on the same counts. Seeded: the same
numbers on every run; each is checked against the stated figure within 4 standard errors of
the smaller run, so a change to the rule or to the simulation shows here before in the docs."""

from __future__ import annotations

import numpy as np
import pytest
from benchmark_scripts import load
from nightly_helpers import greedy_comparison

from codepost.pipeline.nightly import GateConfig, Spend, decide

simulation = load("nightly_gate")
POPULATION = simulation.Population()  # 164 problems, mean 0.4, Beta concentration 0.5
SERIES = 1_000
# docs/nightly.md: `python benchmarks/nightly_gate.py` (10,000 series per figure)
STATED = {
    "never improves, before, 30 nights": 0.177,
    "never improves, after, 365 nights": 0.019,
    "+0.05, after, within 30 nights": 0.390,
    "+0.10, after, within 7 nights": 0.931,
    "guard, -0.024, before": 0.077,
    "guard, -0.024, margin 0.05": 0.803,
}


def _as_stated(rate: float, figure: str) -> bool:
    stated = STATED[figure]
    return abs(rate - stated) < 4 * simulation.standard_error(stated, SERIES)


def test_a_model_that_never_improves_is_promoted_at_most_alpha_of_the_time_over_a_year():
    first = simulation.first_promotions(POPULATION, SERIES, 365, alpha=0.05)
    after = simulation.within(first["after"], 365)
    assert after <= 0.05 and _as_stated(after, "never improves, after, 365 nights")
    before = simulation.within(first["before"], 30)  # the per-night rule: alpha/2 each night
    assert before > 0.1 and _as_stated(before, "never improves, before, 30 nights")


def test_a_real_gain_is_promoted_as_often_as_stated():
    small = simulation.first_promotions(POPULATION, SERIES, 30, gain=0.05)
    large = simulation.first_promotions(POPULATION, SERIES, 7, gain=0.10)
    assert _as_stated(simulation.within(small["after"], 30), "+0.05, after, within 30 nights")
    assert _as_stated(simulation.within(large["after"], 7), "+0.10, after, within 7 nights")


def test_a_guard_stops_a_real_regression_as_often_as_stated_and_passes_one_at_the_margin_rarely():
    regression = simulation.guard_stops(POPULATION, SERIES, -0.024, margins=(0.05,))
    assert _as_stated(regression["before"], "guard, -0.024, before")
    assert _as_stated(regression["margin 0.05"], "guard, -0.024, margin 0.05")
    at_the_margin = simulation.guard_stops(POPULATION, SERIES, -0.05, margins=(0.05,))
    passed = 1 - at_the_margin["margin 0.05"]
    assert passed <= 0.05 + 3 * simulation.standard_error(0.05, SERIES)


@pytest.mark.parametrize(
    ("gained", "lost"), [(8, 1), (6, 0), (5, 0), (10, 0), (20, 9), (3, 3), (1, 8), (0, 0)]
)
def test_the_simulation_decides_as_the_gate_on_the_same_counts(tmp_path, gained, lost):
    gate = greedy_comparison(tmp_path, gained, lost)
    p = float(simulation.gain_p(np.array([gained]), np.array([lost]))[0])
    if gained > lost:
        assert p == pytest.approx(gate.p_gain, rel=1e-9)
    for test in (1, 2, 5, 6):
        promoted, _ = decide(GateConfig(), Spend.of(0.05, test), gate, [])
        assert promoted == (p < simulation.RULES["after"](0.05, test))
    # before: the gate's per-night rule, two-sided p < alpha with a gain (and a guard's veto)
    assert (gate.p_value < 0.05 and gained > lost) == (p < simulation.RULES["before"](0.05, 1))
    reverse = float(simulation.gain_p(np.array([lost]), np.array([gained]))[0])
    assert (gate.p_value < 0.05 and lost > gained) == (reverse < 0.05 / 2)


def test_a_gain_moves_each_series_mean_rate_by_its_size():
    rates = POPULATION.rates(np.random.default_rng(0), 50)
    for change in (0.05, -0.024):
        moved = simulation.moved(rates, change)
        assert np.allclose(moved.mean(axis=1) - rates.mean(axis=1), change, atol=1e-9)
        # every problem moves the same way (but for the 1e-12 that keeps the logit finite)
        assert ((moved - rates) * np.sign(change) > -1e-12).all()
