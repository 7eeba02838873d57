"""The nightly series' pure parts: the gate's decision table on hand-computed McNemar values
and levels, the guards' non-inferiority test, the sign-flip test for sampled runs, the gate's
check that an evaluation is the night's, retention's choice, the config's checks, the series
lock, the history report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from evaluation_helpers import outcomes, write_evaluation
from nightly_helpers import greedy_comparison
from scipy.optimize import minimize_scalar
from scipy.special import gammaln
from scipy.stats import norm, ttest_1samp

from codepost.pipeline.checkpoints.catalog import Entry
from codepost.pipeline.nightly import (
    Decision,
    GateConfig,
    NightlyConfig,
    NightRecord,
    Spend,
    decide,
)
from codepost.pipeline.nightly.gate import (
    StaleEvaluation,
    check_evaluation,
    compare,
    greedy_noninferiority_p,
    level,
    mean_noninferiority_p,
    spent,
)
from codepost.pipeline.nightly.history import PLOT_FILE, write_history
from codepost.pipeline.nightly.retention import prunable, stage_record
from codepost.pipeline.nightly.series import run_night
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.reporting.report import load_evaluation
from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock
from codepost.pipeline.stages.evaluation import EvalConfig

GATE = GateConfig()


def test_a_champions_nights_spend_less_than_alpha_however_many():
    assert level(0.05, 1) == spent(0.05, 1) == pytest.approx(0.05 * (1 - 1 / (1 + math.log(2))))
    assert sum(level(0.05, n) for n in range(1, 366)) == pytest.approx(spent(0.05, 365))
    assert level(0.05, 1) > level(0.05, 2) > level(0.05, 365) > 0
    assert spent(0.05, 0) == 0 and spent(0.05, 10**9) < 0.05
    assert Spend.of(0.05, 3) == Spend(test=3, level=level(0.05, 3), spent=spent(0.05, 3))
    with pytest.raises(ValueError, match="test 1, got 0"):
        level(0.05, 0)


# One-sided exact McNemar: gained ~ Binomial(gained + lost, 1/2) under no difference.
# 8 vs 1: (9 + 1) / 2**9 = 0.01953125; 6 vs 0: 1 / 2**6; 5 vs 0: 1 / 2**5; 10 vs 0: 1 / 2**10.
# Levels at alpha 0.05: 0.0205 (night 1), 0.0057 (2), 0.00125 (5), 0.000937 (6).
@pytest.mark.parametrize(
    ("gained", "lost", "test", "p_gain", "promoted", "why"),
    [
        (8, 1, 1, 0.01953125, True, "significant gain"),
        (8, 1, 2, 0.01953125, False, "no significant gain"),
        (6, 0, 1, 0.015625, True, "significant gain"),
        (5, 0, 1, 0.03125, False, "no significant gain"),
        (10, 0, 5, 1 / 1024, True, "significant gain"),
        (10, 0, 6, 1 / 1024, False, "no significant gain"),
        (0, 0, 1, 1.0, False, "no significant gain"),
        (1, 8, 1, 1.0, False, "no significant gain"),  # significantly worse
    ],
)
def test_the_gate_promotes_on_a_gain_significant_at_the_nights_level_only(
    tmp_path, gained, lost, test, p_gain, promoted, why
):
    gate = greedy_comparison(tmp_path, gained, lost)
    assert (gate.gained, gate.lost, gate.test) == (gained, lost, "exact McNemar")
    assert gate.p_gain == pytest.approx(p_gain, abs=1e-12)
    assert gate.difference == pytest.approx((gained - lost) / gate.problems)
    spend = Spend.of(GATE.alpha, test)
    verdict, reason = decide(GATE, spend, gate, [])
    assert verdict is promoted and reason.startswith(why)
    assert f"against level {spend.level:.3g} (night {test} tested against this champion" in reason
    assert f"+{gained}/-{lost}" in reason


def test_a_guard_not_shown_within_the_margin_keeps_the_champion(tmp_path):
    gate = greedy_comparison(tmp_path / "gate", 8, 1)
    spend = Spend.of(GATE.alpha, 1)
    # 200 guard problems, margin 0.05: unchanged p = 0.0006, 5 each way 0.0055, lost 6: 0.097
    steady = greedy_comparison(tmp_path / "steady", 0, 0, 100, 100, margin=GATE.margin)
    even = greedy_comparison(tmp_path / "even", 5, 5, 95, 95, margin=GATE.margin)
    worse = greedy_comparison(tmp_path / "worse", 0, 6, 97, 97, margin=GATE.margin)
    small = greedy_comparison(tmp_path / "small", 0, 0, margin=GATE.margin)  # 6 problems
    assert decide(GATE, spend, gate, [steady, even]) == decide(GATE, spend, gate, [])
    assert decide(GATE, spend, gate, [])[0]
    verdict, reason = decide(GATE, spend, gate, [steady, worse, small])
    assert not verdict and reason.startswith(
        "not shown within 0.05 of the champion on a guard at alpha=0.05: bench:"
    )
    assert "+0/-6" in reason and "+0/-0" in reason and "worse by 0.05 or more: p=0.0972" in reason
    unchecked = greedy_comparison(tmp_path / "unchecked", 0, 0, 100, 100)  # no margin: untested
    assert not decide(GATE, spend, gate, [unchecked])[0]


def _restricted_loss(gained: int, lost: int, problems: int, margin: float) -> float:
    """The chance of a loss that makes the counts most likely when the night is worse by
    exactly ``margin``, by numerical maximisation (what the closed form must give)."""
    rest = problems - gained - lost

    def minus_log_likelihood(q: float) -> float:
        return -(
            gained * math.log(q - margin) + lost * math.log(q) + rest * math.log(1 - 2 * q + margin)
        )

    bounds = (margin + 1e-12, (1 + margin) / 2 - 1e-12)
    return minimize_scalar(
        minus_log_likelihood, bounds=bounds, method="bounded", options={"xatol": 1e-12}
    ).x


@pytest.mark.parametrize(
    ("gained", "lost", "problems", "margin"),
    [(5, 9, 164, 0.05), (10, 3, 164, 0.03), (20, 20, 100, 0.1), (1, 12, 50, 0.2)],
)
def test_the_greedy_guard_is_tangos_score_test(gained, lost, problems, margin):
    loss = _restricted_loss(gained, lost, problems, margin)
    z = (gained - lost + problems * margin) / math.sqrt(problems * (2 * loss - margin - margin**2))
    p = greedy_noninferiority_p(gained, lost, problems, margin)
    assert p == pytest.approx(norm.sf(z), rel=1e-6)
    # no problem moved: the most likely loss rate is the margin, z = sqrt(n m / (1 - m))
    unchanged = greedy_noninferiority_p(0, 0, problems, margin)
    assert unchanged == pytest.approx(norm.sf(math.sqrt(problems * margin / (1 - margin))))


@pytest.mark.parametrize("problems", [20, 50, 164])
def test_the_greedy_guard_passes_a_night_worse_by_the_margin_at_most_about_its_alpha(problems):
    """The exact chance, every (gained, lost) enumerated, that a night worse by exactly the
    margin (at several loss rates) is shown within it: an asymptotic test, near its level at
    any size (the plain Wald test's reaches 0.29 at 20 problems, 0.08 at 164)."""
    margin, alpha = 0.05, 0.05
    gained, lost = np.meshgrid(np.arange(problems + 1), np.arange(problems + 1), indexing="ij")
    possible = gained + lost <= problems
    gained, lost = gained[possible], lost[possible]
    rest = problems - gained - lost
    passes = greedy_noninferiority_p(gained, lost, problems, margin) < alpha
    for loss in (0.06, 0.08, 0.1, 0.15, 0.25):
        gain = loss - margin
        log_chance = (
            gammaln(problems + 1)
            - gammaln(gained + 1)
            - gammaln(lost + 1)
            - gammaln(rest + 1)
            + gained * math.log(gain)
            + lost * math.log(loss)
            + rest * math.log(1 - gain - loss)
        )
        assert np.exp(log_chance)[passes].sum() < 1.2 * alpha  # at most 0.055 here


def test_the_sampled_guard_is_a_one_sided_t_test_against_minus_the_margin():
    differences = [0.25, -0.5, 0.0, 0.125, -0.25, 0.0, 0.5, -0.125]
    expected = ttest_1samp(differences, -0.05, alternative="greater").pvalue
    assert mean_noninferiority_p(differences, 0.05) == pytest.approx(expected, rel=1e-9)
    assert mean_noninferiority_p([-0.04] * 5, 0.05) == 0.0  # all the same: no doubt left
    assert mean_noninferiority_p([-0.06] * 5, 0.05) == 1.0


def test_failure_no_checkpoint_and_a_corrupt_checkpoint_come_before_any_gain(tmp_path):
    gate = greedy_comparison(tmp_path, 8, 1)
    spend = Spend.of(GATE.alpha, 1)
    assert decide(GATE, spend, gate, [], failed="RuntimeError: boom") == (
        False,
        "the night failed: RuntimeError: boom",
    )
    assert decide(GATE, spend, gate, [], trained=False) == (
        False,
        "the night made no checkpoint",
    )
    verdict, reason = decide(
        GATE, spend, gate, [], verify_problems=["model.safetensors: sha256 differs"]
    )
    assert not verdict and reason == (
        "its checkpoint does not verify: model.safetensors: sha256 differs"
    )


def test_sampled_runs_are_compared_with_the_sign_flip_test(tmp_path):
    n = 12
    champion = {f"task/{i}": (4, 1) for i in range(n)}
    night = {f"task/{i}": (4, 4) for i in range(n)}
    folders = [
        write_evaluation(tmp_path / name, name, None, counts)
        for name, counts in (("champion", champion), ("night", night))
    ]
    sampled = GateConfig(run="sampled")
    evaluations = [load_evaluation(f) for f in folders]
    gate = compare("b", *evaluations, sampled, margin=0.05)
    assert gate.test == "sign-flip" and gate.gained is None
    assert (gate.champion, gate.night, gate.difference) == (0.25, 1.0, 0.75)
    # 12 differences of +0.75: only the pattern of all signs + is as extreme, one-sided
    assert gate.difference_ci95 == (0.75, 0.75) and gate.p_gain == 1 / 2**12
    assert gate.noninferiority_p == 0.0  # every problem gained 0.75
    assert decide(sampled, Spend.of(0.05, 14), gate, [])[0]  # 0.000244 < 0.000256
    assert not decide(sampled, Spend.of(0.05, 15), gate, [])[0]  # 0.000244 > 0.000231
    with pytest.raises(ValueError, match="greedy run, not evaluated"):
        compare("b", *evaluations, GATE)


def test_the_gate_reads_only_evaluations_of_its_checkpoint_on_the_problems_read(
    tmp_path, monkeypatch
):
    folder = write_evaluation(
        tmp_path / "eval", "n1/sft/abc", outcomes({0}, 3), fingerprint="a" * 16
    )
    evaluation = load_evaluation(folder)
    monkeypatch.chdir(tmp_path)
    check_evaluation("sft/b", evaluation, str(tmp_path / "n1" / "sft" / "abc"), "a" * 16)
    check_evaluation("sft/b", evaluation, "n1/sft/abc", None)  # a filter's problems: not read
    with pytest.raises(StaleEvaluation) as stale:
        check_evaluation("sft/b", evaluation, "n1/sft/other", "b" * 16)
    assert str(stale.value) == (
        f"the sft/b evaluation ({folder}) is not the night's: it evaluated n1/sft/abc, not "
        f"n1/sft/other; its problems_fingerprint is {'a' * 16}, the night read {'b' * 16}; the "
        f"gate does not decide on it (delete {folder} and {folder}.json to evaluate again)"
    )


def test_a_checkpoints_stage_record_is_beside_the_stage_folder_that_holds_it(tmp_path):
    night = tmp_path / "n1"
    sft, rl = night / "sft" / "abc", night / "rl" / "def" / "checkpoints" / "iteration-0002"
    for folder in (sft, rl, night / "dpo" / "ghi"):
        folder.mkdir(parents=True)
    for record in (night / "sft" / "abc.json", night / "rl" / "def.json"):
        record.write_text("{}")
    assert stage_record(sft, night) == night / "sft" / "abc.json"
    assert stage_record(rl, night) == night / "rl" / "def.json"
    assert stage_record(night / "dpo" / "ghi", night) is None


def _entry(folder: str, *tags: str) -> Entry:
    return Entry(Path("/series") / folder, folder, None, tags, ())


def test_retention_keeps_the_last_nights_and_every_tagged_checkpoint():
    entries = [
        _entry("n1/sft/a", "champion"),
        _entry("n1/rl/b/checkpoints/iteration-0001"),
        _entry("n2/sft/c"),
        _entry("n3/sft/d"),
        _entry("n4/sft/e", "production"),
        _entry("n5/sft/f"),
        _entry("elsewhere/sft/g"),  # not the series': left alone
    ]
    nights = ["n1", "n2", "n3", "n4", "n5"]
    doomed = [entry.folder for entry in prunable(entries, nights, 2)]
    assert doomed == ["n1/rl/b/checkpoints/iteration-0001", "n2/sft/c", "n3/sft/d"]
    assert prunable(entries, nights, 5) == []
    with pytest.raises(ValueError, match="keep_nights"):
        prunable(entries, nights, 0)


def test_the_gate_must_name_evaluations_of_the_run():
    run = PostTrainConfig(stages=[], evaluations={"mbpp": EvalConfig(), "humaneval": EvalConfig()})
    NightlyConfig(run=run, gate=GateConfig(benchmark="mbpp", guards=["humaneval"]))
    with pytest.raises(ValueError, match=r"'livecodebench' is not one of run\.evaluations"):
        NightlyConfig(run=run, gate=GateConfig(guards=["livecodebench"]))
    with pytest.raises(ValueError, match=r"run\.evaluations\.mbpp has none"):
        NightlyConfig(run=run, gate=GateConfig(benchmark="mbpp", run="sampled"))
    with pytest.raises(ValueError, match="evaluate_base"):
        NightlyConfig(run=run.model_copy(update={"evaluate_base": False}))


def test_a_night_that_finds_its_series_locked_does_not_run(tmp_path):
    config = NightlyConfig(root=str(tmp_path), series="s", run=PostTrainConfig(stages=[]))
    with (
        run_folder_lock(config.series_dir),
        pytest.raises(RunFolderLocked, match="another night of this series is running"),
    ):
        run_night(config, "2026-11-27")
    assert not (config.series_dir / "2026-11-27").exists()


def test_the_history_marks_promotions(tmp_path):
    gate = greedy_comparison(tmp_path, 8, 1)
    guard = greedy_comparison(tmp_path / "guard", 0, 6, 97, 97, margin=0.05)
    decisions = [
        Decision(
            promoted=True,
            reason="significant gain",
            champion="n1/sft",
            alpha=0.05,
            spend=Spend.of(0.05, 1),
            gate=gate,
            guards=[guard],
        ),
        Decision(promoted=False, reason="the night failed: boom", champion="n1/sft", alpha=0.05),
        Decision(
            promoted=False, promoting=True, reason="significant gain", champion="n1", alpha=0.05
        ),
    ]
    records = [
        NightRecord(series="s", night=f"n{i}", started_from="base", decision=decision)
        for i, decision in enumerate(decisions, 1)
    ]
    report = write_history(tmp_path, records).read_text()
    assert "3 night(s), 1 promotion(s)" in report
    assert "| n1 | `base` | 0.2667 [" in report and "+0.4667, +8/-1, p=0.0391" in report
    assert "| 0.0195 vs 0.0205 (1) | bench -0.0300 p=0.0972 |" in report
    assert "**promoted**: significant gain" in report
    assert "kept the champion: the night failed: boom" in report
    assert "| promoting, the tag not moved yet (the next night settles it): significant" in report
    assert (tmp_path / PLOT_FILE).stat().st_size > 0
