"""SFT warm start: TRL's ``SFTTrainer`` on reference solutions, published as a checkpoint.

Rows are prompt/completion pairs built with the sampler's own prompts (:func:`build_prompt`) and
the answer format the verifier reads (:func:`reference_answer`), so SFT teaches exactly the
format that is scored later. TRL trains on the completion only for prompt/completion rows.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ...settings.config import Settings
from ...verifiers import Problem
from ...verifiers.problems import MBPP
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import PromptStyle, build_prompt, reference_answer
from ..model_config import ModelConfig, load_causal_lm, load_tokenizer
from ..training import (
    TrainingSettings,
    already_published,
    console,
    logged_losses,
    publish_trained,
    stage_manifest,
    trainer_arguments,
    trainer_callbacks,
)
from .registry import Artifacts, Stage, register, with_weights

if TYPE_CHECKING:  # datasets and TRL load when the stage runs, not with its config
    from datasets import Dataset
    from trl import SFTTrainer


class SFTStageConfig(Settings):
    """The SFT warm start: which model, on which problems' references, how to optimise."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="the model to fine-tune")
    problems: ProblemSet = Field(
        ProblemSet(source=MBPP, split="train"),
        description="problems whose reference solutions are the targets (MBPP train by default)",
    )
    prompt_style: PromptStyle = Field(
        "chat", description="as the sampler will prompt: chat, or continuation (code prompts)"
    )
    training: TrainingSettings = Field(default_factory=TrainingSettings)


def sft_dataset(problems: dict[str, Problem], tokenizer: Any, style: PromptStyle) -> Dataset:
    """Prompt/completion rows for every problem that has a reference solution."""
    from datasets import Dataset

    rows = []
    for problem in problems.values():
        answer = reference_answer(problem, style)
        if answer is not None:
            rows.append(
                {"prompt": build_prompt(problem, tokenizer, style).text, "completion": answer}
            )
    if not rows:
        raise ValueError(
            f"none of the {len(problems)} problems ({', '.join(list(problems)[:3])}, ...) has a "
            "reference solution (canonical_solution or code) to fine-tune on"
        )
    if len(rows) < len(problems):
        console.print(f"sft: {len(problems) - len(rows)} problems without a reference skipped")
    return Dataset.from_list(rows)


def sft_trainer(
    config: SFTStageConfig, dataset: Dataset, tokenizer: Any, output_dir: Path
) -> SFTTrainer:
    """TRL's trainer for ``config``, loss on the completions only."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        **trainer_arguments(config.training, config.model, output_dir),
        completion_only_loss=True,
    )
    return SFTTrainer(
        model=load_causal_lm(config.model),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=config.model.peft_config(),
        callbacks=trainer_callbacks("sft"),
    )


def run_sft(config: SFTStageConfig, out_dir: Path) -> Path:
    """Fine-tune ``config.model`` on the reference solutions of ``config.problems``; the
    published checkpoint (LoRA merged) in ``out_dir``. Under ``accelerate launch`` the trainer
    shares each batch among the ranks (``per_device_train_batch_size`` is per rank) and the
    main process alone publishes."""
    out_dir = Path(out_dir)
    if already_published(out_dir, "sft", config):
        return out_dir

    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(config.model)
    dataset = sft_dataset(problems, tokenizer, config.prompt_style)
    data = {"problems": fingerprint(problems)}
    console.print(f"sft: {len(dataset)} examples from {config.problems.source}")

    with tempfile.TemporaryDirectory(prefix="codepost-sft-") as scratch:
        trainer = sft_trainer(config, dataset, tokenizer, Path(scratch))
        started = time.monotonic()
        result = trainer.train()
    metrics = {
        "train_loss": result.training_loss,
        "losses": logged_losses(trainer),
        "steps": result.global_step,
        "examples": len(dataset),
        "wall_s": round(time.monotonic() - started, 1),
    }
    console.print(f"sft: done {metrics}")
    manifest = stage_manifest("sft", config, config.model.name_or_path, data, metrics)
    publish_trained(out_dir, trainer, manifest, config.training.save_dtype)
    return out_dir


def _stage(config: SFTStageConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    return Artifacts(checkpoint=str(run_sft(with_weights(config, inputs.checkpoint), out_dir)))


register(
    Stage(
        name="sft",
        config=SFTStageConfig,
        run=_stage,
        needs=(),
        uses=("checkpoint",),
        makes=("checkpoint",),
        multi_process=True,
        description="supervised fine-tuning on reference solutions (the warm start)",
    )
)
