"""The rollouts stage: G completions per problem from the current checkpoint, scored in the
sandbox (the data DPO's pairs are mined from)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from ...settings.config import Settings
from ...verifiers.problems import MBPP
from ..data.problem_sets import ProblemSet, load_problem_set
from ..data.prompts import PromptStyle, build_prompt
from ..data.rows import write_rows
from ..inference.engines import get_sampler
from ..inference.episodes import EpisodeConfig, check_episodes
from ..inference.sampling import EngineConfig, SamplingConfig, check_room
from ..model_config import ModelConfig, load_tokenizer
from .registry import Artifacts, Stage, kept_problems, register, with_weights
from .scoring import ScoreConfig, run_score, with_episodes


class SampleStageConfig(Settings):
    """The sampling stage on its own: G completions per problem from one checkpoint."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    problems: ProblemSet = Field(
        default_factory=lambda: ProblemSet(source=MBPP, split="train", limit=16)
    )
    prompt_style: PromptStyle = "chat"
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(max_tokens=256))
    episodes: EpisodeConfig = Field(
        default_factory=EpisodeConfig,
        description="each sample an episode of answers and the environment's feedback "
        "(RFT then trains on the passing episodes, the model's turns only)",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="after")
    def _fits(self) -> SampleStageConfig:
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        check_episodes(self.episodes, self.prompt_style, self.engine)
        return self


def run_sample(
    config: SampleStageConfig, out_dir: Path, scoring: ScoreConfig | None = None
) -> Path:
    """Sample ``config.problems`` with the model; writes and returns ``rollouts.parquet``
    (reused when it is already there: the stage is resumable). Episodes' answers run under
    ``scoring``'s sandbox settings."""
    target = Path(out_dir) / "rollouts.parquet"
    if target.is_file():
        return target
    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(config.model)
    prompts = [build_prompt(p, tokenizer, config.prompt_style) for p in problems.values()]
    sampler = with_episodes(
        get_sampler(config.model, config.engine),
        tokenizer,
        problems,
        config.episodes,
        scoring or ScoreConfig(),
    )
    return write_rows(sampler.sample(prompts, config.sampling), target)


class RolloutsConfig(SampleStageConfig):
    """What to sample (problems, sampling, engine) and how to score it."""

    scoring: ScoreConfig = Field(default_factory=ScoreConfig)


def run_rollouts(config: RolloutsConfig, out_dir: Path) -> Path:
    """Sample and score ``config.problems``; returns ``scored.parquet`` in ``out_dir``."""
    rollouts = run_sample(config, out_dir, config.scoring)
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
