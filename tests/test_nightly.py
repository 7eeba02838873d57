"""A real series of nights on tiny models (evaluations on the hf engine, scoring in the Docker
sandbox): night 1 gains the six problems its start cannot solve and is promoted (6 gained, 0
lost: one-sided exact McNemar p = 1/64, below a champion's first level, 0.0205); night 2
trains from that champion for real, gains nothing and keeps it; night 3's checkpoint is
corrupted after it is published: its evaluation refuses it, and the night fails and keeps the
champion; night 4 fails (its problems are gone) and keeps the champion.

Night 1's training is the one thing not real: its SFT publishes a model built to answer
(``next_token_lm``), the same on any CPU, where a random tiny model fine-tuned for a fixed
number of steps learned the six answers on one CPU and not on another. That SFT learns is
tests/test_sft.py's. The flow around a night: tests/test_flows.py; the series' own logic on
nights without a model: tests/test_nightly_series.py."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from nightly_helpers import PROBLEMS, write_problems
from safetensors.torch import load_file, save_file
from tiny_models import char_tokenizer, next_token_lm
from transformers import AutoTokenizer

from codepost.pipeline.checkpoints.catalog import resolve
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish_model
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.launch import execute_launched
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.nightly import NightFailed, NightlyConfig, run_night
from codepost.pipeline.nightly.history import PLOT_FILE, REPORT_FILE
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.registry import Artifacts
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HF = EngineConfig(backend="hf")
ANSWERS = {" ": "1"}  # after "    return ": 1, then EOS


def _silent_model(folder: Path) -> ModelConfig:
    """Night 1's start: a model that ends every answer at once (``return`` alone: None)."""
    tokenizer = char_tokenizer(string.printable)
    next_token_lm(tokenizer, {}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return ModelConfig(name_or_path=str(folder))


def _series(tmp_path: Path, problems: Path) -> NightlyConfig:
    """Each night trains a step at a tiny rate: it moves no answer of a model built to
    answer, and so gains nothing on it."""
    ones = ProblemSet(source=str(problems), split="all")
    sft = SFTStageConfig(
        problems=ones,
        prompt_style="continuation",
        training=TrainingSettings(
            max_steps=1, learning_rate=1e-6, per_device_train_batch_size=PROBLEMS
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
        model=_silent_model(tmp_path / "silent"),
        stages=[{"stage": "sft", "config": sft}],
        evaluations={"ones": evaluation},
    )
    return NightlyConfig(root=str(tmp_path / "series"), series="ones", run=run, keep_nights=1)


def _answering(stage, config, inputs, out_dir, label, launch=None):
    """The run's executor, but its SFT publishes a model built to answer the problems, as
    the stage publishes what it trained."""
    if stage.name != "sft":
        return execute_launched(stage, config, inputs, out_dir, label, launch)
    tokenizer = AutoTokenizer.from_pretrained(inputs.checkpoint)
    manifest = CheckpointManifest(stage="sft", version="answers", parent=inputs.checkpoint)
    publish_model(out_dir, next_token_lm(tokenizer, ANSWERS), tokenizer, manifest)
    return Artifacts(checkpoint=str(out_dir))


def _corrupting(stage, config, inputs, out_dir, label, launch=None):
    """The run's executor, then the published checkpoint's weights file rewritten: the same
    tensors, other bytes (its manifest's sha256 tells)."""
    outputs = execute_launched(stage, config, inputs, out_dir, label, launch)
    if outputs.checkpoint is not None:
        weights = Path(outputs.checkpoint) / "model.safetensors"
        save_file(load_file(weights), weights, metadata={"format": "pt", "tampered": "yes"})
    return outputs


def test_a_series_promotes_a_significant_gain_only(tmp_path):
    problems = write_problems(tmp_path / "ones.jsonl")
    series = _series(tmp_path, problems)
    series_dir = series.series_dir

    first = run_night(series, "n1", _answering).decision
    assert first is not None and first.promoted, first
    assert first.gate is not None
    assert (first.gate.gained, first.gate.lost, first.gate.p_gain) == (PROBLEMS, 0, 1 / 64)
    assert first.spend is not None and first.spend.test == 1  # one-sided level 0.0205
    champion = resolve(series_dir, "champion")
    assert champion.folder.startswith("n1/sft/") and first.champion == str(champion.path)
    record = json.loads((series_dir / "n1" / "night.json").read_text())
    assert record["started_from"] == series.run.model.name_or_path
    assert {d["count"] for d in record["data"]} == {PROBLEMS}  # what it read, with its hash

    second = run_night(series, "n2")
    assert second.started_from == str(champion.path)
    assert second.decision is not None and not second.decision.promoted
    assert second.decision.reason.startswith(
        "no significant gain: one-sided p=1 against level 0.0205 (night 1 tested against this "
        "champion"
    )
    gate = second.decision.gate
    assert gate is not None and (gate.gained, gate.lost, gate.p_value) == (0, 0, 1.0)
    assert (gate.champion, gate.night) == (1.0, 1.0)
    (night_2_checkpoint,) = (series_dir / "n2" / "sft").glob("*/manifest.json")

    # the evaluation checks the checkpoint it reads first: the night fails before its gate
    corrupt = "ManifestMismatch: .*/model.safetensors: sha256 differs from the manifest"
    with pytest.raises(NightFailed, match=f"the night failed: {corrupt}"):
        run_night(series, "n3", _corrupting)
    assert resolve(series_dir, "champion").folder == champion.folder
    # retention (keep_nights=1): night 2's checkpoint went, the champion (night 1's) stayed
    assert not night_2_checkpoint.exists() and champion.path.is_dir()

    problems.unlink()  # night 4 cannot read its problems: it fails and changes nothing
    with pytest.raises(NightFailed, match="the night failed: FileNotFoundError"):
        run_night(series, "n4")
    assert resolve(series_dir, "champion").folder == champion.folder

    report = (series_dir / REPORT_FILE).read_text()
    assert "4 night(s), 1 promotion(s)" in report and (series_dir / PLOT_FILE).is_file()
    assert "+1.0000, +6/-0, p=0.0312" in report and "| 0.0156 vs 0.0205 (1) |" in report
    assert "kept the champion: the night failed: ManifestMismatch" in report
