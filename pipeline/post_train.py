"""The whole post-training run as one config: SFT, the difficulty filter, the RL loop, DPO on
mined pairs, and the evaluations after each stage that trains.

The Prefect ``post-train`` flow and ``codepost run`` take this config; each stage's own
``model`` is replaced by the run's ``model`` pointing at the previous stage's checkpoint, so the
stages chain, and a ``filter`` stage hands the problems it kept to the RL stage and the DPO
rollouts after it. The layout of a run folder (one ``eval/<benchmark>`` per evaluation)::

    base/eval/humaneval/  sft/  sft/eval/humaneval/  filter/problems/
    rl/checkpoints/iteration-NNNN/  rl/rollouts/  rl/eval/humaneval/
    rollouts/  pairs/  dpo/  dpo/eval/humaneval/  report.md  pass_at_1.png
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..verifiers.problems import MBPP
from .data.problem_sets import ProblemSet
from .inference.sampling import SampleStageConfig
from .model_config import ModelConfig
from .stages.difficulty_filter import DifficultyFilterConfig
from .stages.dpo import DPOStageConfig
from .stages.evaluation import EvalConfig
from .stages.pairs import PairMiningConfig
from .stages.rl import RLConfig
from .stages.sft import SFTStageConfig

Stage = Literal["sft", "filter", "rl", "dpo"]
StageConfig = TypeVar("StageConfig", bound=BaseModel)


class PostTrainConfig(BaseModel):
    """One post-training run. Each stage's ``model`` is ignored: the run's ``model`` is used,
    loading the previous stage's checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str = Field("runs/post-train", description="where every artifact of the run goes")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the base model")
    stages: list[Stage] = Field(
        default_factory=lambda: ["sft", "rl", "dpo"],
        description="which stages run, in order; 'filter' rates problems with the current "
        "checkpoint and hands the ones kept to the RL stage and the DPO rollouts after it",
    )
    sft: SFTStageConfig = Field(default_factory=SFTStageConfig)
    difficulty_filter: DifficultyFilterConfig = Field(default_factory=DifficultyFilterConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    dpo_pairs_from: Literal["fresh", "rl"] = Field(
        "fresh",
        description="where DPO's pairs are mined: 'fresh' rollouts of the checkpoint "
        "(dpo_rollouts), or every scored rollout of the RL stage",
    )
    dpo_rollouts: SampleStageConfig = Field(
        default_factory=SampleStageConfig, description="the rollouts DPO's pairs are mined from"
    )
    pairs: PairMiningConfig = Field(default_factory=PairMiningConfig)
    dpo: DPOStageConfig = Field(default_factory=DPOStageConfig)
    evaluations: dict[str, EvalConfig] = Field(
        default_factory=lambda: {"humaneval": EvalConfig()},
        min_length=1,
        description="benchmark name -> evaluation, run on the base model and after every "
        "stage that trains",
    )

    @model_validator(mode="after")
    def _pairs_have_a_source(self) -> PostTrainConfig:
        stages = self.stages
        if (
            self.dpo_pairs_from == "rl"
            and "dpo" in stages
            and "rl" not in stages[: stages.index("dpo")]
        ):
            raise ValueError("dpo_pairs_from='rl' needs an 'rl' stage before 'dpo' in stages")
        if self.dpo_pairs_from == "rl" and not self.pairs.several_policies:
            raise ValueError(
                "dpo_pairs_from='rl' mines the rollouts of every RL iteration's policy: set "
                "pairs.several_policies to train DPO on them as offline pairs"
            )
        return self


def with_checkpoint(config: StageConfig, model: ModelConfig, checkpoint: str) -> StageConfig:
    """``config`` with its ``model`` set to the run's model loading ``checkpoint``."""
    return config.model_copy(
        update={"model": model.model_copy(update={"name_or_path": checkpoint})}
    )


def with_problems(config: StageConfig, problems: ProblemSet | None) -> StageConfig:
    """``config`` with ``problems`` (a filter's output) when there are any."""
    return config if problems is None else config.model_copy(update={"problems": problems})


def embedded_default(run_dir: str = "runs/post-train") -> PostTrainConfig:
    """The README's main job: SmolLM2-135M on the CPU, small settings (about 15 minutes on 2
    cores): SFT on 32 MBPP training references, 3 GRPO iterations with dynamic sampling on
    MBPP training problems, DPO on pairs mined from fresh rollouts, greedy pass@1 on all 164
    HumanEval problems (with intervals and paired tests) before and after each stage."""
    from .inference.sampling import SamplingConfig
    from .rl.policy_update import UpdateConfig
    from .training import TrainingSettings

    mbpp_train = ProblemSet(source=MBPP, split="train", shuffle_seed=0)
    return PostTrainConfig(
        run_dir=run_dir,
        sft=SFTStageConfig(
            problems=mbpp_train.model_copy(update={"limit": 32}),
            training=TrainingSettings(per_device_train_batch_size=4, max_length=384),
        ),
        rl=RLConfig(
            problems=mbpp_train,
            iterations=3,
            prompts_per_iteration=4,
            max_sampling_rounds=2,
            sampling=SamplingConfig(num_generations=4, max_tokens=256),
            update=UpdateConfig(
                lr=2e-6, micro_batch_size=4, sampler_is_cap=2.0, mask_truncated=True
            ),
        ),
        dpo_rollouts=SampleStageConfig(
            problems=mbpp_train.model_copy(update={"limit": 12}),
            sampling=SamplingConfig(num_generations=4, max_tokens=192),
        ),
        # A 135M model rarely passes: prefer by reward (format, syntax) as well as pass/fail,
        # or there is nothing to prefer and DPO is skipped.
        pairs=PairMiningConfig(reward_margin=0.1),
        dpo=DPOStageConfig(
            training=TrainingSettings(
                learning_rate=5e-7, per_device_train_batch_size=2, max_length=384
            )
        ),
        evaluations={"humaneval": EvalConfig(max_tokens=256)},
    )
