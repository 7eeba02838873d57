"""A real series of nights on a tiny model (SFT and evaluations on the hf engine, scoring in
the Docker sandbox): night 1 learns six problems it could not solve and is promoted (6 gained,
0 lost: exact McNemar p = 0.03125); night 2 trains from that champion, gains nothing and keeps
it; night 3's checkpoint is corrupted after it is published and is not promoted; night 4 fails
(its problems are gone) and keeps the champion. The flow around a night: tests/test_flows.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from stage_helpers import save_tiny_model

from codepost.pipeline.checkpoints.registry import resolve
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.launch import execute_launched
from codepost.pipeline.nightly import NightFailed, NightlyConfig, run_night
from codepost.pipeline.nightly.history import PLOT_FILE, REPORT_FILE
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HF = EngineConfig(backend="hf")
PROBLEMS = 6


def _problems(folder: Path) -> Path:
    """Six HumanEval-style problems with one short answer: a tiny model learns it in a few
    dozen steps, and a random one never writes it."""
    path = folder / "ones.jsonl"
    rows = [
        {
            "task_id": f"ones/{i}",
            "prompt": f"def one_{i}():\n",
            "canonical_solution": "    return 1\n",
            "test": "def check(candidate):\n    assert candidate() == 1\n",
            "entry_point": f"one_{i}",
        }
        for i in range(PROBLEMS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _series(tmp_path: Path, problems: Path, steps: int, learning_rate: float) -> NightlyConfig:
    from codepost.pipeline.data.problem_sets import ProblemSet

    ones = ProblemSet(source=str(problems), split="all")
    sft = SFTStageConfig(
        problems=ones,
        prompt_style="continuation",
        training=TrainingSettings(
            max_steps=steps, learning_rate=learning_rate, per_device_train_batch_size=PROBLEMS
        ),
    )
    evaluation = EvalConfig(
        problems=ones,
        prompt_style="continuation",
        sampling=SamplingConfig(max_tokens=16),
        engine=HF,
        scoring=ScoreConfig(workers=2),
    )
    run = PostTrainConfig(
        model=save_tiny_model(tmp_path / "tiny"),
        stages=[{"stage": "sft", "config": sft}],
        evaluations={"ones": evaluation},
    )
    return NightlyConfig(root=str(tmp_path / "series"), series="ones", run=run, keep_nights=1)


def _corrupting(stage, config, inputs, out_dir, label, launch=None):
    """The run's executor, then the published checkpoint's weights file rewritten: the same
    tensors (the evaluation cannot tell), other bytes (its manifest's sha256 can)."""
    outputs = execute_launched(stage, config, inputs, out_dir, label, launch)
    if outputs.checkpoint is not None:
        weights = Path(outputs.checkpoint) / "model.safetensors"
        save_file(load_file(weights), weights, metadata={"format": "pt", "tampered": "yes"})
    return outputs


def test_a_series_promotes_a_significant_gain_only(tmp_path):
    problems = _problems(tmp_path)
    learn = _series(tmp_path, problems, steps=40, learning_rate=2e-2)
    series_dir = learn.series_dir

    first = run_night(learn, "n1").decision
    assert first is not None and first.promoted, first
    assert first.gate is not None
    assert (first.gate.gained, first.gate.lost, first.gate.p_value) == (PROBLEMS, 0, 0.03125)
    champion = resolve(series_dir, "champion")
    assert champion.folder.startswith("n1/sft/") and first.champion == str(champion.path)
    record = json.loads((series_dir / "n1" / "night.json").read_text())
    assert record["started_from"] == learn.run.model.name_or_path
    assert {d["count"] for d in record["data"]} == {PROBLEMS}  # what it read, with its hash

    # Later nights barely train: a step at a tiny rate from the champion.
    settle = _series(tmp_path, problems, steps=1, learning_rate=1e-6)
    second = run_night(settle, "n2")
    assert second.started_from == str(champion.path)
    assert second.decision is not None and not second.decision.promoted
    assert second.decision.reason.startswith("no significant gain at alpha=0.05")
    gate = second.decision.gate
    assert gate is not None and (gate.gained, gate.lost, gate.p_value) == (0, 0, 1.0)
    (night_2_checkpoint,) = (series_dir / "n2" / "sft").glob("*/manifest.json")

    third = run_night(settle, "n3", _corrupting).decision
    assert third is not None and not third.promoted
    assert third.reason == (
        "its checkpoint does not verify: model.safetensors: sha256 differs from the manifest"
    )
    assert resolve(series_dir, "champion").folder == champion.folder
    # retention (keep_nights=1): night 2's checkpoint went, the champion (night 1's) stayed
    assert not night_2_checkpoint.exists() and champion.path.is_dir()

    problems.unlink()  # night 4 cannot read its problems: it fails and changes nothing
    with pytest.raises(NightFailed, match="the night failed: FileNotFoundError"):
        run_night(settle, "n4")
    assert resolve(series_dir, "champion").folder == champion.folder

    report = (series_dir / REPORT_FILE).read_text()
    assert "4 night(s), 1 promotion(s)" in report and (series_dir / PLOT_FILE).is_file()
    assert "+1.0000, +6/-0, p=0.0312" in report and "kept the champion: its checkpoint" in report
