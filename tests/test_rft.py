"""Rejection-sampling fine-tuning: the passing completions kept (deduplicated, capped, cut ones
left out), fine-tuned on with the SFT trainer round after round, and every round resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_helpers import rollout, save_tiny_model, tiny_problem_set, write_rollouts

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.stages import rft
from codepost.pipeline.stages.rft import RFTConfig, passing_examples, round_dir, run_rft
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.pipeline.training import TrainingSettings

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ADD_SPACED = ADD + "\n\n"  # the same text once stripped
ADD_OTHER = "```python\ndef add(a, b):\n    return b + a\n```"
DOUBLE = "```python\ndef double(x):\n    return 2 * x\n```"


def test_the_passing_completions_are_kept_once_each_and_at_most_m_per_problem():
    rows = [
        rollout("1", ADD, True, 1.0),
        rollout("1", ADD_SPACED, True, 1.0),  # a duplicate
        rollout("1", ADD_OTHER, True, 1.0),
        rollout("1", "```python\ndef add(a, b):\n    return 3\n```", False, 0.0),
        rollout("2", DOUBLE, True, 1.0) | {"finish_reason": "length"},  # cut: left out
        rollout("3", DOUBLE, False, 0.0),
    ]
    first = passing_examples(rows, [], max_per_problem=4)
    assert [(e["prompt_id"], e["completion"]) for e in first] == [("1", ADD), ("1", ADD_OTHER)]
    assert first[0]["prompt"] == rows[0]["prompt"]
    assert passing_examples(rows, [], max_per_problem=1) == first[:1]
    # A later round adds only what the earlier rounds lack, under the same cap.
    later = [rollout("1", ADD, True, 1.0), rollout("3", DOUBLE, True, 1.0)]
    assert [e["prompt_id"] for e in passing_examples(later, first, max_per_problem=2)] == ["3"]
    assert passing_examples(later, first[:1], max_per_problem=1) == [
        {"prompt_id": "3", "prompt": later[1]["prompt"], "completion": DOUBLE}
    ]


def test_rft_is_a_registered_stage_that_can_start_from_scored_rollouts():
    assert PostTrainConfig(stages=["sft", "filter", "rft"])
    with pytest.raises(ValueError, match="stages\\[1\\] \\(rft\\): first_round is 'scored'"):
        PostTrainConfig(stages=["sft", {"stage": "rft", "config": {"first_round": "scored"}}])
    scored_first = {"stage": "rft", "config": {"first_round": "scored"}}
    assert PostTrainConfig(stages=["sft", "rollouts", scored_first])


@pytest.mark.docker
def test_rounds_fine_tune_on_the_passes_publish_a_checkpoint_each_and_resume(tmp_path, monkeypatch):
    """Round 1 keeps the passes of scored rollouts given to it; round 2 samples a tiny model
    for real (hf generate, scored in the sandbox), which passes nothing new, and fine-tunes on
    round 1's examples again from the input checkpoint. A rerun trains nothing; a third round
    continues in the same folder."""
    model = save_tiny_model(tmp_path / "model")
    scored = write_rollouts(
        tmp_path / "scored.parquet",
        [
            rollout("1", ADD, True, 1.0),
            rollout("1", ADD, True, 1.0),
            rollout("2", DOUBLE, True, 1.0),
        ],
    )
    config = RFTConfig(
        model=model,
        problems=tiny_problem_set(tmp_path),
        rounds=2,
        first_round="scored",
        sampling=SamplingConfig(num_generations=2, max_tokens=8),
        engine=EngineConfig(backend="hf"),
        scoring=ScoreConfig(workers=2, timeout_s=3.0),
        training=TrainingSettings(max_steps=2, learning_rate=1e-3, per_device_train_batch_size=2),
    )
    out = tmp_path / "rft"
    last = run_rft(config, out, scored)
    assert last == round_dir(out, 2) / "checkpoint"
    rows = [json.loads(line) for line in (out / rft.METRICS_FILE).read_text().splitlines()]
    assert [(r["round"], r["samples"], r["new_examples"], r["examples"]) for r in rows] == [
        (1, 3, 2, 2),
        (2, 6, 0, 2),  # 3 problems x 2 samples of the tiny model: no pass
    ]
    assert all(r["steps"] == 2 and r["time/train_s"] > 0 for r in rows)
    for number in (1, 2):
        manifest = read_manifest(round_dir(out, number) / "checkpoint")
        assert manifest.parent == model.name_or_path  # every round restarts from the input
        assert manifest.stage == f"rft-round-{number:02d}" and manifest.config["rounds"] == number
        assert verify(round_dir(out, number) / "checkpoint") == []
    assert (round_dir(out, 2) / "scored.parquet").is_file()
    examples = (round_dir(out, 2) / rft.EXAMPLES_FILE).read_text().splitlines()
    assert [json.loads(line)["completion"] for line in examples] == [ADD, DOUBLE]

    def no_training(*args, **kwargs):
        raise AssertionError("a published round was trained again")

    monkeypatch.setattr(rft, "sft_trainer", no_training)
    assert run_rft(config, out, scored) == last
    with pytest.raises(AssertionError, match="trained again"):  # only round 3 is new
        run_rft(config.model_copy(update={"rounds": 3}), out, scored)
    assert (round_dir(out, 3) / "scored.parquet").is_file()
    assert not (round_dir(out, 3) / "checkpoint").exists()


def test_a_round_without_any_pass_is_named(tmp_path):
    scored = write_rollouts(tmp_path / "scored.parquet", [rollout("1", ADD, False, 0.0)])
    config = RFTConfig(model=save_tiny_model(tmp_path / "model"), first_round="scored")
    with pytest.raises(ValueError, match="no completion of 1 problems passed in round 1"):
        run_rft(config, tmp_path / "rft", scored)
    assert not Path(tmp_path / "rft" / "round-01" / "checkpoint").exists()
