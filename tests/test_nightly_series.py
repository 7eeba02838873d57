"""The series across nights, on nights without a model (tests/nightly_helpers.py): a promotion
survives a stop between the gate and the tag, a champion gone or corrupt stops the next night,
retention leaves every night askable again, the gate refuses evaluations of other data, and
each night tested against a champion spends the next share of alpha, once."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nightly_helpers import (
    AFTER_THE_TAG,
    ANSWERS,
    BEFORE_THE_TAG,
    fake_execute,
    fake_series,
    greedy_comparison,
    stopping_tag,
    write_problems,
)

from codepost.pipeline.checkpoints.catalog import read_tags, tag
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish
from codepost.pipeline.nightly import (
    ChampionUnusable,
    Decision,
    NightFailed,
    NightlyConfig,
    NightRecord,
    Spend,
    run_night,
    series,
)
from codepost.pipeline.nightly.records import NIGHT_RECORD, read_history


class Stopped(BaseException):
    """A crash no handler of the night catches, as a kill: nothing after it runs."""


def _stop() -> None:
    raise Stopped


def _record(config: NightlyConfig, night: str) -> NightRecord:
    return NightRecord.read(config.series_dir / night / NIGHT_RECORD)


def _checkpoint(config: NightlyConfig, night: str) -> Path:
    (manifest,) = (config.series_dir / night / "sft").glob("*/manifest.json")
    return manifest.parent


def _champion(config: NightlyConfig) -> str | None:
    return read_tags(config.series_dir).get("champion")


def _gate_crashes(*args, **kwargs):
    raise RuntimeError("the gate crashed")


@pytest.mark.parametrize("point", [BEFORE_THE_TAG, AFTER_THE_TAG])
@pytest.mark.parametrize("asked", ["n1", "n2"])
def test_a_promotion_stopped_before_its_record_says_promoted_is_finished(
    tmp_path, monkeypatch, point, asked
):
    """Stopped between the gate and the tag, or between the tag and the record: the night
    asked again, or the next night, finishes the promotion; the next night starts from it."""
    config = fake_series(tmp_path)
    monkeypatch.setattr(series, "tag", stopping_tag(point, _stop))
    with pytest.raises(Stopped):
        run_night(config, "n1", fake_execute)
    monkeypatch.undo()
    checkpoint = _checkpoint(config, "n1")
    decision = _record(config, "n1").decision
    assert decision is not None and decision.promoting and not decision.promoted
    assert decision.champion == "blank" and decision.candidate == str(checkpoint)
    assert _champion(config) == (None if point == BEFORE_THE_TAG else "n1/sft/" + checkpoint.name)

    record = run_night(config, asked, fake_execute)
    first = _record(config, "n1").decision
    assert first is not None and first.promoted and not first.promoting
    assert first.champion == str(checkpoint) and first.gate == decision.gate
    assert _champion(config) == f"n1/sft/{checkpoint.name}"
    if asked == "n2":
        assert record.started_from == str(checkpoint)
        assert record.decision is not None and not record.decision.promoted
    report = (config.series_dir / "report.md").read_text()
    assert "1 promotion(s)" in report and "promoting" not in report


@pytest.mark.slow
def test_a_night_killed_between_the_gate_and_the_tag_is_finished_when_asked_again(tmp_path):
    """A real SIGKILL in the window the fault campaign hit: the record is promoting, the tag
    has not moved; asked again, the night moves it and says promoted."""
    config = fake_series(tmp_path)
    config_file = tmp_path / "series.json"
    config_file.write_text(config.model_dump_json())
    helper = Path(__file__).with_name("nightly_helpers.py")
    killed = subprocess.run(
        [sys.executable, str(helper), str(config_file), "n1", BEFORE_THE_TAG],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    decision = _record(config, "n1").decision
    assert decision is not None and decision.promoting and _champion(config) is None

    record = run_night(config, "n1", fake_execute)
    assert record.decision is not None and record.decision.promoted
    assert _champion(config) == "n1/sft/" + _checkpoint(config, "n1").name


def _corrupt(checkpoint: Path) -> None:
    (checkpoint / ANSWERS).write_text("{}")


def _tag_another_champion(config: NightlyConfig) -> None:
    other = config.series_dir / "elsewhere"
    publish(
        other,
        lambda folder: (folder / ANSWERS).write_text("{}"),
        CheckpointManifest(stage="sft", version="0"),
    )
    tag(config.series_dir, "elsewhere", "champion")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda config: _corrupt(_checkpoint(config, "n1")), "answers.json: sha256 differs"),
        (_tag_another_champion, "the champion is now .*elsewhere, not blank that the gate"),
    ],
)
def test_a_stopped_promotion_that_cannot_finish_fails_and_keeps_the_champion(
    tmp_path, monkeypatch, change, why
):
    config = fake_series(tmp_path)
    monkeypatch.setattr(series, "tag", stopping_tag(BEFORE_THE_TAG, _stop))
    with pytest.raises(Stopped):
        run_night(config, "n1", fake_execute)
    monkeypatch.undo()
    change(config)
    champion = _champion(config)
    with pytest.raises(NightFailed, match=f"its promotion cannot finish: {why}"):
        run_night(config, "n1", fake_execute)
    decision = _record(config, "n1").decision
    assert decision is not None and not decision.promoted and not decision.promoting
    assert decision.gate is not None and decision.gate.gained == 6  # the gate's numbers stay
    assert _champion(config) == champion


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (shutil.rmtree, "no checkpoint there"),
        (_corrupt, r"it does not match its manifest \(answers.json: sha256 differs"),
    ],
)
def test_a_champion_gone_or_corrupt_stops_the_next_night(tmp_path, damage, problem):
    """Never the run's model instead: that is only where a series without the tag starts."""
    config = fake_series(tmp_path)
    first = run_night(config, "n1", fake_execute)
    assert first.started_from == "blank" and first.decision is not None
    assert first.decision.promoted
    damage(_checkpoint(config, "n1"))
    tags = config.series_dir / "tags.json"
    with pytest.raises(ChampionUnusable, match=f"{tags}: champion -> 'n1/sft/.*': {problem}"):
        run_night(config, "n2", fake_execute)
    assert not (config.series_dir / "n2").exists()


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (Path.unlink, "no champion tag, yet night 'n1' was promoted"),
        (lambda path: path.write_text("{}"), "no champion tag, yet night 'n1' was promoted"),
        (lambda path: path.write_text('{"champ'), "not JSON"),
        (lambda path: path.write_text("[]"), "not a mapping of tag names"),
    ],
    ids=["deleted", "emptied", "truncated", "not a mapping"],
)
def test_a_lost_tags_file_stops_the_next_night(tmp_path, damage, problem):
    """A series that promoted has a champion: without the tag the next night would start
    from, and be gated against, the run's model without a word."""
    config = fake_series(tmp_path)
    assert run_night(config, "n1", fake_execute).decision.promoted  # type: ignore[union-attr]
    tags = config.series_dir / "tags.json"
    damage(tags)
    with pytest.raises(ChampionUnusable, match=f"{tags}: {problem}"):
        run_night(config, "n2", fake_execute)
    assert not (config.series_dir / "n2").exists()


def test_retention_leaves_a_failed_night_askable_and_keeps_the_newest_nights(tmp_path, monkeypatch):
    """keep_nights=1: night 2 failed at the gate, its checkpoint went when night 3 ran; asked
    again, it trains again (no "does not match its record"), keeps its place in the series'
    order, and retention then deletes its new checkpoint, not night 3's."""
    seconds = itertools.count()  # a clock a second apart at each call, on any machine
    monkeypatch.setattr(series, "now", lambda: f"2026-01-01T00:00:{next(seconds):02d}+00:00")
    config = fake_series(tmp_path, keep_nights=1)
    run_night(config, "n1", fake_execute)
    with monkeypatch.context() as gate:
        gate.setattr(series, "compare", _gate_crashes)
        with pytest.raises(NightFailed, match="the gate crashed"):
            run_night(config, "n2", fake_execute)
    failed = _checkpoint(config, "n2")
    started = _record(config, "n2").started_at
    run_night(config, "n3", fake_execute)
    assert not failed.exists() and not failed.with_name(f"{failed.name}.json").exists()
    newest = _checkpoint(config, "n3")

    again = run_night(config, "n2", fake_execute)
    assert again.decision is not None and again.decision.failed is None
    assert again.started_at == started == "2026-01-01T00:00:01+00:00"
    assert [r.night for r in read_history(config.series_dir)] == ["n1", "n2", "n3"]
    assert newest.is_dir() and not list((config.series_dir / "n2" / "sft").glob("*/manifest.json"))


def test_a_night_asked_again_after_its_benchmark_changed_does_not_gate_on_stale_evaluations(
    tmp_path, monkeypatch
):
    """The fault campaign's night: it fails at the gate, its benchmark file is edited, it is
    asked again. It must gate on evaluations of the current file (0 -> 0: kept), never on
    those from before the edit (0 -> 6: promoted)."""
    config = fake_series(tmp_path)
    monkeypatch.setattr(series, "compare", _gate_crashes)
    with pytest.raises(NightFailed, match="the gate crashed"):
        run_night(config, "n1", fake_execute)
    monkeypatch.undo()
    write_problems(tmp_path / "ones.jsonl", answer=2)
    record = run_night(config, "n1", fake_execute)  # the stage key holds the file's content
    assert record.decision is not None and not record.decision.promoted
    gate = record.decision.gate
    assert gate is not None and (gate.champion, gate.night) == (0.0, 0.0)
    assert _champion(config) is None


def test_a_night_gates_only_on_the_problems_it_read(tmp_path):
    """The benchmark edited after the night read it, before any evaluation: both models were
    evaluated on the same problems (the run's report agrees), not on those the night read and
    records; the gate names the first evaluation and refuses to decide."""
    config = fake_series(tmp_path)

    def editing(stage, config_, inputs, out_dir, label, launch=None):
        if label == "base/ones":
            write_problems(tmp_path / "ones.jsonl", answer=2)
        return fake_execute(stage, config_, inputs, out_dir, label, launch)

    read = r"its problems_fingerprint is \w+, the night read \w+; the gate does not decide on it"
    with pytest.raises(NightFailed, match=f"StaleEvaluation: the base/ones evaluation .*: {read}"):
        run_night(config, "n1", editing)
    decision = _record(config, "n1").decision
    assert decision is not None and decision.gate is None and _champion(config) is None


def _spent(config: NightlyConfig, night: str) -> int | None:
    decision = _record(config, night).decision
    assert decision is not None
    return decision.spend.test if decision.spend is not None else None


def test_each_night_against_a_champion_spends_the_next_share_of_alpha_once(tmp_path, monkeypatch):
    """Nothing to gain (the benchmark's answers are 2, training teaches 1): every night is
    tested against the run's model. A night that failed before its gate spent nothing; one
    that failed after it keeps its number when asked again; the count outlives retention
    (keep_nights=1). The fifth test then gains all six problems, p = 1/64: enough on a
    champion's first night (level 0.0205), not on its fifth (0.00125)."""
    config = fake_series(tmp_path, keep_nights=1)
    write_problems(tmp_path / "ones.jsonl", answer=2)
    run_night(config, "n1", fake_execute)
    with monkeypatch.context() as crash:
        crash.setattr(series, "compare", _gate_crashes)
        with pytest.raises(NightFailed, match="the gate crashed"):
            run_night(config, "n2", fake_execute)
    run_night(config, "n3", fake_execute)
    with monkeypatch.context() as crash:
        crash.setattr(series, "_metrics", _gate_crashes)  # after the gate decided
        with pytest.raises(NightFailed, match="the gate crashed"):
            run_night(config, "n4", fake_execute)
    assert [_spent(config, night) for night in ("n1", "n2", "n3", "n4")] == [1, None, 2, 3]
    run_night(config, "n2", fake_execute)
    run_night(config, "n4", fake_execute)
    assert [_spent(config, night) for night in ("n2", "n4")] == [4, 3]

    write_problems(tmp_path / "train.jsonl", answer=2)  # training now teaches the answers
    fifth = run_night(config, "n5", fake_execute).decision
    assert fifth is not None and fifth.spend == Spend.of(0.05, 5) and not fifth.promoted
    assert fifth.gate is not None and (fifth.gate.gained, fifth.gate.p_gain) == (6, 1 / 64)
    assert fifth.reason.startswith(
        "no significant gain: one-sided p=0.0156 against level 0.00125 (night 5 tested"
    )
    assert _champion(config) is None
    decisions = [r.decision for r in read_history(config.series_dir)]
    assert all(d is not None and not d.promoted and d.failed is None for d in decisions)


def test_the_count_restarts_with_each_champion(tmp_path):
    """The night that wins moves the champion; the next night is the new champion's first
    test, at alpha's largest share again."""
    config = fake_series(tmp_path)
    first = run_night(config, "n1", fake_execute).decision
    assert first is not None and first.promoted and first.spend == Spend.of(0.05, 1)
    second = run_night(config, "n2", fake_execute)
    assert second.started_from == first.champion
    assert second.decision is not None and second.decision.spend == Spend.of(0.05, 1)
    third = run_night(config, "n3", fake_execute).decision
    assert third is not None and third.spend == Spend.of(0.05, 2)


def test_a_night_recorded_before_nights_spent_alpha_counts_as_one_test(tmp_path):
    """A series older than the count: its nights gated against the champion have no number,
    and each spent alpha all the same. Six problems gained (p = 1/64) promote a first test
    (level 0.0205), not this second one (0.0057)."""
    config = fake_series(tmp_path)
    legacy = Decision(
        promoted=False,
        reason="no significant gain",
        champion="blank",
        alpha=0.05,
        gate=greedy_comparison(tmp_path / "legacy", 0, 0),
    )
    NightRecord(series="ones", night="n0", started_from="blank", decision=legacy).write(
        config.series_dir / "n0"
    )
    first = run_night(config, "n1", fake_execute).decision
    assert first is not None and first.spend == Spend.of(0.05, 2) and not first.promoted
    assert first.reason.startswith("no significant gain: one-sided p=0.0156 against level 0.00571")


def test_a_night_cancelled_before_its_gate_records_it_and_runs_when_asked_again(tmp_path):
    """Cancelled while it trains (Ctrl-C here; a flow run's cancel is Prefect's SIGTERM, as
    tests/test_deployments.py checks): the record says cancelled, the champion kept, nothing
    spent, and the series' report has the night. Asked again, the night runs, reusing the
    base evaluation it made before the cancel, and is the champion's first test."""
    config = fake_series(tmp_path)

    def cancelled_at_sft(stage, config_, inputs, out_dir, label, launch=None):
        if stage.name == "sft":
            raise KeyboardInterrupt
        return fake_execute(stage, config_, inputs, out_dir, label, launch)

    with pytest.raises(KeyboardInterrupt):
        run_night(config, "n1", cancelled_at_sft)
    record = _record(config, "n1")
    decision = record.decision
    assert decision is not None and decision.cancelled == "KeyboardInterrupt"
    assert not decision.promoted and not decision.promoting and decision.failed is None
    assert decision.champion == "blank" and decision.spend is None and _champion(config) is None
    report = (config.series_dir / "report.md").read_text()
    assert "| n1 |" in report and "kept the champion: the night was cancelled (Keyboard" in report
    (base,) = config.series_dir.glob("n1/base/eval/ones/*/evaluation.json")
    made = base.stat().st_mtime_ns

    again = run_night(config, "n1", fake_execute)
    assert again.started_at == record.started_at
    assert again.decision is not None and again.decision.promoted
    assert again.decision.spend == Spend.of(0.05, 1) and again.decision.cancelled is None
    assert base.stat().st_mtime_ns == made
