"""The nightly series' pure parts: the gate's decision table on hand-computed McNemar values,
the paired bootstrap for sampled runs, the gate's check that an evaluation is the night's,
retention's choice, the config's checks, the series lock, the history report."""

from __future__ import annotations

from pathlib import Path

import pytest
from evaluation_helpers import outcomes, write_evaluation

from codepost.pipeline.checkpoints.registry import Entry
from codepost.pipeline.nightly import Decision, GateConfig, NightlyConfig, NightRecord, decide
from codepost.pipeline.nightly.gate import StaleEvaluation, check_evaluation, compare
from codepost.pipeline.nightly.history import PLOT_FILE, write_history
from codepost.pipeline.nightly.retention import prunable, stage_record
from codepost.pipeline.nightly.series import run_night
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.reporting.report import load_evaluation
from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock
from codepost.pipeline.stages.evaluation import EvalConfig

GREEDY = GateConfig()


def _greedy(tmp_path: Path, gained: int, lost: int, both: int = 3, neither: int = 3):
    """The champion and the night on the same problems: ``gained`` solved by the night only,
    ``lost`` by the champion only."""
    n = gained + lost + both + neither
    champion = set(range(gained, gained + lost + both))
    night = set(range(gained)) | set(range(gained + lost, gained + lost + both))
    folders = [
        write_evaluation(tmp_path / name, name, outcomes(solved, n))
        for name, solved in (("champion", champion), ("night", night))
    ]
    return compare("bench", *(load_evaluation(f) for f in folders), GREEDY)


# Exact McNemar, two-sided: gained ~ Binomial(gained + lost, 1/2) under no difference.
# 8 vs 1: 2 * (1 + 9) / 2**9 = 0.0390625; 5 vs 0: 2 / 2**5 = 0.0625; 6 vs 0: 2 / 2**6.
@pytest.mark.parametrize(
    ("gained", "lost", "p_value", "alpha", "promoted", "why"),
    [
        (8, 1, 0.0390625, 0.05, True, "significant gain"),
        (8, 1, 0.0390625, 0.01, False, "no significant gain"),
        (5, 0, 0.0625, 0.05, False, "no significant gain"),
        (6, 0, 0.03125, 0.05, True, "significant gain"),
        (0, 0, 1.0, 0.05, False, "no significant gain"),
        (1, 8, 0.0390625, 0.05, False, "no significant gain"),  # significantly worse
    ],
)
def test_the_gate_promotes_on_a_significant_gain_only(
    tmp_path, gained, lost, p_value, alpha, promoted, why
):
    gate = _greedy(tmp_path, gained, lost)
    assert (gate.gained, gate.lost, gate.test) == (gained, lost, "exact McNemar")
    assert gate.p_value == pytest.approx(p_value, abs=1e-12)
    assert gate.difference == pytest.approx((gained - lost) / gate.problems)
    verdict, reason = decide(alpha, gate, [])
    assert verdict is promoted and reason.startswith(why)
    assert f"+{gained}/-{lost}" in reason


def test_a_guard_significantly_worse_keeps_the_champion(tmp_path):
    gate = _greedy(tmp_path / "gate", 8, 1)
    worse = _greedy(tmp_path / "worse", 0, 6)  # p = 0.03125 < 0.05
    noisy = _greedy(tmp_path / "noisy", 1, 5)  # p = 0.21875: not significant
    assert decide(0.05, gate, [noisy]) == (True, decide(0.05, gate, [])[1])
    verdict, reason = decide(0.05, gate, [noisy, worse])
    assert not verdict and reason.startswith("significantly worse on a guard")
    assert "+0/-6" in reason and "+1/-5" not in reason


def test_failure_no_checkpoint_and_a_corrupt_checkpoint_come_before_any_gain(tmp_path):
    gate = _greedy(tmp_path, 8, 1)
    assert decide(0.05, gate, [], failed="RuntimeError: boom") == (
        False,
        "the night failed: RuntimeError: boom",
    )
    assert decide(0.05, gate, [], trained=False) == (False, "the night made no checkpoint")
    verdict, reason = decide(0.05, gate, [], verify_problems=["model.safetensors: sha256 differs"])
    assert not verdict and reason == (
        "its checkpoint does not verify: model.safetensors: sha256 differs"
    )


def test_sampled_runs_are_compared_with_the_paired_bootstrap(tmp_path):
    n = 12
    champion = {f"task/{i}": (4, 1) for i in range(n)}
    night = {f"task/{i}": (4, 4) for i in range(n)}
    folders = [
        write_evaluation(tmp_path / name, name, None, counts)
        for name, counts in (("champion", champion), ("night", night))
    ]
    gate = compare("b", *(load_evaluation(f) for f in folders), GateConfig(run="sampled"))
    assert gate.test == "paired bootstrap" and gate.gained is None
    assert (gate.champion, gate.night, gate.difference) == (0.25, 1.0, 0.75)
    assert gate.difference_ci95 == (0.75, 0.75) and gate.p_value == 0.0
    assert decide(0.05, gate, [])[0]
    with pytest.raises(ValueError, match="greedy run, not evaluated"):
        compare("b", *(load_evaluation(f) for f in folders), GREEDY)


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
    gate = _greedy(tmp_path, 8, 1)
    decisions = [
        Decision(
            promoted=True, reason="significant gain", champion="n1/sft", alpha=0.05, gate=gate
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
    assert "**promoted**: significant gain" in report
    assert "kept the champion: the night failed: boom" in report
    assert "| promoting, the tag not moved yet (the next night settles it): significant" in report
    assert (tmp_path / PLOT_FILE).stat().st_size > 0
