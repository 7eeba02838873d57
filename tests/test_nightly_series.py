"""The series across nights, on nights without a model (tests/nightly_helpers.py): a champion
gone or corrupt stops the next night, and the gate refuses evaluations of other data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from nightly_helpers import ANSWERS, fake_execute, fake_series, write_problems

from codepost.pipeline.checkpoints.registry import read_tags
from codepost.pipeline.nightly import (
    ChampionUnusable,
    NightFailed,
    NightlyConfig,
    NightRecord,
    run_night,
    series,
)
from codepost.pipeline.nightly.records import NIGHT_RECORD


def _record(config: NightlyConfig, night: str) -> NightRecord:
    return NightRecord.read(config.series_dir / night / NIGHT_RECORD)


def _checkpoint(config: NightlyConfig, night: str) -> Path:
    (manifest,) = (config.series_dir / night / "sft").glob("*/manifest.json")
    return manifest.parent


def _champion(config: NightlyConfig) -> str | None:
    return read_tags(config.series_dir).get("champion")


def _gate_crashes(*args, **kwargs):
    raise RuntimeError("the gate crashed")


def _corrupt(checkpoint: Path) -> None:
    (checkpoint / ANSWERS).write_text("{}")


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
    try:
        record = run_night(config, "n1", fake_execute)
    except NightFailed as failed:
        # Until the stage key holds the problems' content, the evaluations are reused: the
        # gate refuses them, naming the first and both hashes, and promotes nothing.
        assert "the base/ones evaluation" in str(failed)
        assert "is not the night's: its problems_fingerprint is" in str(failed)
        assert _champion(config) is None
        pytest.xfail("the stage key does not hold the problems' content yet")
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
