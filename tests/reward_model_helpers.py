"""For the reward-model tests: scored rollouts whose passing and failing completions differ in
one visible way, and a tiny reward model trained on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines import saved_tiny_model
from stage_helpers import rollout, write_rollouts

from codepost.pipeline.stages.reward_model import RewardModelConfig, run_reward_model


def passing(problem: int, variant: int) -> str:
    return f"def f{variant}(x):\n    return x + {problem}\n"


def failing(problem: int, variant: int) -> str:
    return f"def f{variant}(x):\n    return x - {problem}\n"


def signal_rollouts(problems: int = 12, per_side: int = 3) -> list[dict[str, Any]]:
    """``per_side`` passing (``+``) and failing (``-``) completions of each problem, and one
    problem whose only sample fails."""
    rows = []
    for problem in range(problems):
        for variant in range(per_side):
            rows.append(rollout(f"p{problem}", passing(problem, variant), True, 1.0))
            rows.append(rollout(f"p{problem}", failing(problem, variant), False, 0.0))
    rows.append(rollout("all-fail", failing(99, 0), False, 0.0))
    for row in rows:
        row["completion_style"] = "continuation"
    return rows


def small_reward_model_config(folder: Path, **settings: Any) -> RewardModelConfig:
    """A tiny random model under the head (its tokenizer pads with EOS, as SmolLM2's does) and
    settings that fit :func:`signal_rollouts`: two epochs at a high learning rate. The tests
    ask every held-out pair ranked right: one epoch did so down to a third of this rate (at a
    tenth, AUROC 0.94), a margin a machine's floating-point path could eat; two epochs do at
    a tenth (at a thirtieth, 0.987)."""
    model = saved_tiny_model(folder / "model")
    return RewardModelConfig.model_validate(
        {
            "model": model.model_dump(),
            "min_pairs": 8,
            "min_held_out_problems": 2,
            "training": {
                "learning_rate": 3e-3,
                "num_train_epochs": 2,
                "per_device_train_batch_size": 4,
                "max_length": 128,
                "logging_steps": 1,
            },
            **settings,
        }
    )


def trained_reward_model(folder: Path) -> Path:
    """A tiny reward model trained on :func:`signal_rollouts`, published in ``folder/rm``."""
    scored = write_rollouts(folder / "scored.parquet", signal_rollouts())
    return run_reward_model(small_reward_model_config(folder), scored, folder / "rm")
