"""The rescore stage: scored rollouts scored again under another reward (e.g. a stricter time
limit, or format and syntax terms), so pairs or an update can use it without sampling again."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from ...settings.config import Settings
from ...verifiers.problems import MBPP
from ..data.problem_sets import ProblemSet
from .registry import Artifacts, Stage, kept_problems, register
from .scoring import ScoreConfig, run_score


class RescoreConfig(Settings):
    """The problems the rollouts were sampled from, and the scoring to apply."""

    problems: ProblemSet = Field(
        default_factory=lambda: ProblemSet(source=MBPP, split="train", shuffle_seed=0),
        description="the rollouts' problems (a filter's, when one ran before)",
    )
    scoring: ScoreConfig = Field(default_factory=ScoreConfig)


def _stage(config: RescoreConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    if inputs.scored is None:
        raise ValueError("rescore: no rollouts to score again")
    config = kept_problems(config, inputs.problems)
    return Artifacts(
        scored=str(run_score(config.scoring, Path(inputs.scored), config.problems, out_dir))
    )


register(
    Stage(
        name="rescore",
        config=RescoreConfig,
        run=_stage,
        needs=("scored",),
        uses=("problems",),
        makes=("scored",),
        accelerator=False,
        description="score rollouts again under another reward",
    )
)
