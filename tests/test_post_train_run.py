"""The run loop on its own (no Prefect): SFT then RL on a tiny model, both rank-aware, so each
on 2 processes. Run again unchanged, everything is reused; with RL's learning rate changed, SFT and
its evaluation are reused and RL is computed into a new folder (the old one kept), with the
reason logged."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from stage_helpers import save_tiny_model, tiny_problem_set

from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.launch import LaunchConfig
from codepost.pipeline.post_train import RUN_RECORD, PostTrainConfig, run_post_train
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings
from codepost.verifiers import RewardConfig

HF = EngineConfig(backend="hf")


def _config(tmp_path: Path, lr: float) -> PostTrainConfig:
    problems = tiny_problem_set(tmp_path)
    sft = SFTStageConfig(
        problems=problems,
        training=TrainingSettings(max_steps=2, per_device_train_batch_size=3),
    )
    rl = RLConfig(
        problems=problems,
        iterations=1,
        prompts_per_iteration=2,
        dynamic_sampling=False,
        sampling=SamplingConfig(num_generations=2, max_tokens=8),
        engine=HF,
        scoring=ScoreConfig(
            workers=2,
            reward=RewardConfig(
                weights={"test": 1.0, "length": 1.0}, params={"length": {"budget": 1}}
            ),
        ),
        update=UpdateConfig(learning_rate=lr),
    )
    return PostTrainConfig(
        run_dir=str(tmp_path / "run"),
        model=save_tiny_model(tmp_path / "tiny"),
        stages=[{"stage": "sft", "config": sft}, {"stage": "rl", "config": rl}],
        evaluations={
            "tiny": EvalConfig(problems=problems, sampling=SamplingConfig(max_tokens=8), engine=HF)
        },
        launch=LaunchConfig(num_processes=2),
    )


def _records(run_dir: Path) -> dict[str, float]:
    """Every finished output's record -> when it was written."""
    return {str(p.relative_to(run_dir)): p.stat().st_mtime for p in run_dir.rglob("*/*.json")
            if p.with_suffix("").is_dir() and p.parent.name != "checkpoints"}  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
def test_a_rerun_reuses_what_did_not_change_and_recomputes_what_did(tmp_path, caplog):
    config = _config(tmp_path, lr=1e-2)
    run_dir = Path(config.run_dir)
    with caplog.at_level(logging.INFO, logger="codepost.launch"):
        first = run_post_train(config)
    assert "sft on 2 process(es)" in caplog.text  # the ranks' lines
    caplog.clear()
    records = _records(run_dir)
    # base/eval, sft, sft/eval, rl, rl/eval: five finished outputs
    assert sorted(Path(r).parts[0] for r in records) == ["base", "rl", "rl", "sft", "sft"]
    run = json.loads((run_dir / RUN_RECORD).read_text())
    assert [stage["name"] for stage in run["stages"]] == ["sft", "rl"] and run["seed"] == 0

    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        again = run_post_train(config)
    assert again == first and _records(run_dir) == records  # nothing was computed again
    assert caplog.text.count("reusing") == 5

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        changed = run_post_train(_config(tmp_path, lr=5e-3))
    after = _records(run_dir)
    assert {name: after[name] for name in records} == records  # nothing was overwritten
    new = sorted(Path(r).parts[0] for r in set(after) - set(records))
    assert new == ["rl", "rl"]  # RL and its evaluation; SFT and the base evaluation reused
    assert changed.checkpoint != first.checkpoint
    assert "update.learning_rate: 0.01 -> 0.005" in caplog.text
    assert caplog.text.count("reusing") == 3  # base eval, sft, sft eval
