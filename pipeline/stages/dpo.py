"""DPO / IPO on mined pass/fail pairs: TRL's ``DPOTrainer``, published as a checkpoint.

The model to train is the checkpoint that sampled the rollouts, and it is also the reference:
its log-probs of every pair are computed once before the first step
(``precompute_ref_log_probs``), so no second model is held. The held-out pairs are scored
before and after training (loss, implicit reward margin ``beta * (log-ratio chosen - log-ratio
rejected)``, preference accuracy); before training the margins are 0 by construction, since
policy and reference are the same weights.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...settings.config import Settings
from ..checkpoints.manifest import read_manifest
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
    from datasets import Dataset, DatasetDict
    from trl import DPOTrainer

EVAL_METRICS = (
    "loss",
    "rewards/margins",
    "rewards/accuracies",
    "rewards/chosen",
    "rewards/rejected",
)


class DPOStageConfig(Settings):
    """Preference training on mined pairs: which model, which loss, how strong the KL anchor."""

    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the checkpoint that sampled the rollouts: trained, and the frozen reference",
    )
    loss_type: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid = DPO; ipo = IPO")
    beta: float = Field(
        0.1, gt=0, description="DPO: the KL weight beta; IPO: tau, the target margin is 1/(2 tau)"
    )
    training: TrainingSettings = Field(
        default_factory=lambda: TrainingSettings(learning_rate=5e-7, per_device_train_batch_size=2)
    )


class DPOResult(BaseModel):
    """The published checkpoint (None when there was nothing to train on) and its metrics."""

    model_config = ConfigDict(frozen=True)

    checkpoint: Path | None
    metrics: dict[str, Any]


def load_pairs(pairs: Path) -> DatasetDict:
    """Published pairs (train / test), checked to be pairs."""
    from datasets import DatasetDict, load_from_disk

    read_manifest(pairs)  # raises when it is not a published artifact
    dataset = load_from_disk(str(pairs))
    if not isinstance(dataset, DatasetDict) or "train" not in dataset:
        raise ValueError(f"pairs {pairs}: expected a DatasetDict with a 'train' split")
    missing = {"prompt", "chosen", "rejected"} - set(dataset["train"].column_names)
    if missing:
        raise ValueError(f"pairs {pairs}: missing column(s) {', '.join(sorted(missing))}")
    return dataset


def dpo_trainer(
    config: DPOStageConfig,
    train: Dataset,
    held_out: Dataset | None,
    output_dir: Path,
) -> DPOTrainer:
    """TRL's trainer for ``config``: reference log-probs of both splits precomputed from the
    untrained model, and the held-out split scored as training starts.

    That first score is the trainer's ``eval_on_start``, not an ``evaluate()`` call before
    ``train()``: such a call prepares the model for evaluation, and accelerate then takes it as
    prepared and never wraps it in DDP, so each rank would train alone on its shard."""
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        **trainer_arguments(config.training, config.model, output_dir),
        loss_type=[config.loss_type],
        beta=config.beta,
        precompute_ref_log_probs=True,
        eval_on_start=held_out is not None,
    )
    return DPOTrainer(
        model=load_causal_lm(config.model),
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        processing_class=load_tokenizer(config.model),
        peft_config=config.model.peft_config(),
        callbacks=trainer_callbacks("dpo"),
    )


def check_reference(config: DPOStageConfig, pairs: Path) -> None:
    """The model must be the checkpoint that sampled the pairs' rollouts: it is the reference."""
    sampled_by = read_manifest(pairs).data.get("sampler_weights")
    if sampled_by and Path(sampled_by).resolve() != Path(config.model.resolve()).resolve():
        raise ValueError(
            f"pairs {pairs} were sampled by {sampled_by}, but the DPO model is "
            f"{config.model.name_or_path}: train (and take as reference) the sampling checkpoint"
        )


def _held_out_metrics(scores: dict[str, float]) -> dict[str, float]:
    return {name: scores[f"eval_{name}"] for name in EVAL_METRICS}


def run_dpo(config: DPOStageConfig, pairs: Path | None, out_dir: Path) -> DPOResult:
    """Train ``config.model`` on the published ``pairs``; the checkpoint in ``out_dir``.
    ``pairs`` None (mining found none, :attr:`MinedPairs.path`) skips the stage, writing nothing.
    Under ``accelerate launch`` the trainer shares each batch among the ranks
    (``per_device_train_batch_size`` is per rank) and the main process alone publishes."""
    out_dir = Path(out_dir)
    if pairs is None:
        console.print("[yellow]dpo: no pairs were mined; DPO skipped[/yellow]")
        return DPOResult(checkpoint=None, metrics={"skipped": "no pairs were mined"})
    if already_published(out_dir, "dpo", config):
        return DPOResult(checkpoint=out_dir, metrics=read_manifest(out_dir).metrics)
    dataset = load_pairs(pairs)
    check_reference(config, pairs)
    held_out = dataset.get("test")  # absent when mining held nothing out
    console.print(
        f"dpo: {config.loss_type} beta={config.beta} on {len(dataset['train'])} pairs, "
        f"{len(held_out) if held_out is not None else 0} held out"
    )

    with tempfile.TemporaryDirectory(prefix="codepost-dpo-") as scratch:
        trainer = dpo_trainer(config, dataset["train"], held_out, Path(scratch))
        started = time.monotonic()
        result = trainer.train()
        metrics: dict[str, Any] = {}
        if held_out is not None:
            before = next(entry for entry in trainer.state.log_history if "eval_loss" in entry)
            metrics["held_out_before"] = _held_out_metrics(before)
        metrics.update(
            train_loss=result.training_loss,
            losses=logged_losses(trainer),
            steps=result.global_step,
            train_pairs=len(dataset["train"]),
            wall_s=round(time.monotonic() - started, 1),
        )
        if held_out is not None:
            metrics["held_out_after"] = _held_out_metrics(trainer.evaluate())
    console.print(f"dpo: done {metrics}")
    data = {"pairs": read_manifest(pairs).version}
    manifest = stage_manifest("dpo", config, config.model.name_or_path, data, metrics)
    publish_trained(out_dir, trainer, manifest, config.training.save_dtype)
    return DPOResult(checkpoint=out_dir, metrics=metrics)


def _stage(config: DPOStageConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    pairs = Path(inputs.pairs) if inputs.pairs else None
    result = run_dpo(with_weights(config, inputs.checkpoint), pairs, out_dir)
    return Artifacts(checkpoint=str(result.checkpoint) if result.checkpoint else None)


register(
    Stage(
        name="dpo",
        config=DPOStageConfig,
        run=_stage,
        needs=("pairs",),
        uses=("checkpoint",),
        makes=("checkpoint",),
        multi_process=True,
        description="DPO / IPO on mined pairs (skipped when mining found none)",
    )
)
