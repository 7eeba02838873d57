"""The rollouts stage: G completions per problem from the current checkpoint, scored in the
sandbox (the data DPO's pairs are mined from)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from ..inference.sampling import SampleStageConfig, run_sample
from .difficulty_filter import kept_problems
from .registry import Artifacts, Stage, register, with_weights
from .scoring import ScoreConfig, run_score


class RolloutsConfig(SampleStageConfig):
    """What to sample (problems, sampling, engine) and how to score it."""

    scoring: ScoreConfig = Field(default_factory=ScoreConfig)


def run_rollouts(config: RolloutsConfig, out_dir: Path) -> Path:
    """Sample and score ``config.problems``; returns ``scored.parquet`` in ``out_dir``."""
    rollouts = run_sample(config, out_dir)
    return run_score(config.scoring, rollouts, config.problems, out_dir)


def _stage(config: RolloutsConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    config = kept_problems(with_weights(config, inputs.checkpoint), inputs.problems)
    return Artifacts(scored=str(run_rollouts(config, out_dir)))


register(
    Stage(
        name="rollouts",
        config=RolloutsConfig,
        run=_stage,
        needs=(),
        uses=("checkpoint", "problems"),
        makes=("scored",),
        description="sample G completions per problem and score them in the sandbox",
    )
)
