"""The whole post-training run as one config: SFT, the RL loop, DPO on mined pairs, and the
evaluation after each stage; plus the report it leaves (pass@1 per stage, as a table and a plot).

The Prefect ``post-train`` flow and ``codepost run`` take this config; each stage's own
``model`` is replaced by the run's ``model`` pointing at the previous stage's checkpoint, so the
stages chain. The layout of a run folder::

    base/eval/  sft/  sft/eval/  rl/checkpoints/iteration-NNNN/  rl/eval/
    pairs/  dpo/  dpo/eval/  report.md  pass_at_1.png  tags.json
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from codepost.pipeline.data import ProblemSet
from codepost.pipeline.dpo import DPOStageConfig
from codepost.pipeline.evaluation import EvalConfig
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.pairs import PairMiningConfig
from codepost.pipeline.plots import plot_curves
from codepost.pipeline.rl import RLConfig
from codepost.pipeline.sampling import SampleStageConfig
from codepost.pipeline.sft import SFTStageConfig
from codepost.verifiers.problems import MBPP

Stage = Literal["sft", "rl", "dpo"]
StageConfig = TypeVar("StageConfig", bound=BaseModel)
REPORT_FILE = "report.md"
PASS_PLOT_FILE = "pass_at_1.png"


class PostTrainConfig(BaseModel):
    """One post-training run. Each stage's ``model`` is ignored: the run's ``model`` is used,
    loading the previous stage's checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str = Field("runs/post-train", description="where every artifact of the run goes")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the base model")
    stages: list[Stage] = Field(
        default_factory=lambda: ["sft", "rl", "dpo"], description="which stages run, in order"
    )
    sft: SFTStageConfig = Field(default_factory=SFTStageConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    dpo_rollouts: SampleStageConfig = Field(
        default_factory=SampleStageConfig, description="the rollouts DPO's pairs are mined from"
    )
    pairs: PairMiningConfig = Field(default_factory=PairMiningConfig)
    dpo: DPOStageConfig = Field(default_factory=DPOStageConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig, description="after every stage")


def with_checkpoint(config: StageConfig, model: ModelConfig, checkpoint: str) -> StageConfig:
    """``config`` with its ``model`` set to the run's model loading ``checkpoint``."""
    return config.model_copy(
        update={"model": model.model_copy(update={"name_or_path": checkpoint})}
    )


def embedded_default(run_dir: str = "runs/post-train") -> PostTrainConfig:
    """The README's main job: SmolLM2-135M on the CPU, small settings (about 10 minutes on 2
    cores): SFT on 32 MBPP training references, 3 GRPO iterations on MBPP training problems,
    DPO on pairs mined from fresh rollouts, greedy pass@1 on 32 HumanEval problems after each
    stage."""
    from codepost.pipeline.policy_update import UpdateConfig
    from codepost.pipeline.sampling import SamplingConfig
    from codepost.pipeline.training import TrainingSettings

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
            sampling=SamplingConfig(num_generations=4, max_tokens=128),
            update=UpdateConfig(lr=2e-6, micro_batch_size=4, sampler_is_cap=2.0),
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
        evaluation=EvalConfig(problems=ProblemSet(limit=32), max_tokens=256),
    )


def pass_at_1_rows(evaluations: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluated stage: greedy pass@1 and its counts."""
    rows = []
    for stage, results in evaluations.items():
        greedy = results.get("greedy", {})
        rows.append(
            {
                "stage": stage,
                "checkpoint": results.get("checkpoint", ""),
                "greedy pass@1": greedy.get("pass@1", math.nan),
                "passed": greedy.get("passed", 0),
                "problems": results.get("num_problems", 0),
                "sandbox errors": greedy.get("sandbox_errors", 0),
            }
        )
    return rows


def write_report(run_dir: Path, evaluations: dict[str, dict[str, Any]]) -> Path:
    """``report.md`` (the pass@1 table, links to checkpoints and plots) and ``pass_at_1.png``."""
    rows = pass_at_1_rows(evaluations)
    plot_curves(
        rows,
        run_dir / PASS_PLOT_FILE,
        x="stage",
        panels={"greedy pass@1": ["greedy pass@1"]},
        title=f"pass@1 after each stage ({rows[0]['problems']} problems)",
    )
    lines = [
        "# Post-training run",
        "",
        "| stage | greedy pass@1 | passed | problems | sandbox errors | checkpoint |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['stage']} | {row['greedy pass@1']:.4f} | {row['passed']} | "
            f"{row['problems']} | {row['sandbox errors']} | `{row['checkpoint']}` |"
        )
    lines += ["", f"![pass@1 per stage]({PASS_PLOT_FILE})"]
    if (run_dir / "rl" / "reward_curve.png").is_file():
        lines += ["", "![RL reward curve](rl/reward_curve.png)"]
    path = run_dir / REPORT_FILE
    path.write_text("\n".join(lines) + "\n")
    (run_dir / "evaluations.json").write_text(json.dumps(evaluations, indent=2) + "\n")
    return path
