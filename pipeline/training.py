"""What the TRL-trainer stages (SFT, DPO) share: optimisation settings, trainer arguments, and
publishing their checkpoint (or finding it already published, so a rerun resumes for free)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from ..settings.config import Seed
from .checkpoints.manifest import (
    CheckpointManifest,
    is_published,
    lineage_base,
    publish_model,
    read_manifest,
)
from .model_config import Dtype, ModelConfig, resolve_model

if TYPE_CHECKING:  # the trainers' libraries load with a trainer, not with TrainingSettings
    import torch
    from transformers import Trainer, TrainerCallback

# Under `accelerate launch` every rank runs the stage: only the first (RANK 0) prints, so each
# line is in the log once.
console = Console(stderr=True, quiet=os.environ.get("RANK", "0") != "0")


class TrainingSettings(BaseModel):
    """Optimisation settings common to the TRL trainers (their names as in ``TrainingArguments``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(2e-5, gt=0, le=1)
    num_train_epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, ge=-1, description="optimizer steps; -1 = run the epochs")
    per_device_train_batch_size: int = Field(4, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_length: int = Field(512, ge=16, description="tokens per sequence (prompt + completion)")
    warmup_steps: int = Field(0, ge=0)
    logging_steps: int = Field(5, ge=1)
    save_dtype: Dtype | Literal["base"] = Field(
        "base",
        description="the published weights' dtype: base = the base model's (the one the "
        "lineage started from, as its config.json says: float32 for the embedded model, "
        "de-quantised; bfloat16 for most hub models), or one of its own; training runs in "
        "model.dtype either way",
    )
    seed: Seed = 0


def trainer_arguments(
    settings: TrainingSettings, model: ModelConfig, output_dir: Path
) -> dict[str, Any]:
    """Keyword arguments for ``SFTConfig`` / ``DPOConfig``: our settings plus what this project
    needs everywhere (no mixed precision, no intermediate saves, no ``report_to``: the logs
    reach the run's trackers through :func:`trainer_callbacks`, steps shown by
    :class:`~.trainer_progress.StepProgress` instead of tqdm)."""
    import torch

    return {
        **settings.model_dump(exclude={"save_dtype"}),
        "output_dir": str(output_dir),
        "per_device_eval_batch_size": settings.per_device_train_batch_size,
        "gradient_checkpointing": model.gradient_checkpointing,
        "bf16": False,  # weights keep ModelConfig.dtype; autocast is off (TRL on CPUs)
        "save_strategy": "no",
        "disable_tqdm": True,
        "report_to": "none",
        "dataloader_pin_memory": torch.cuda.is_available(),  # pinning helps copies to a GPU only
        **_sharding_arguments(model),
    }


def trainer_callbacks(stage: str) -> list[TrainerCallback]:
    """What every TRL stage's trainer reports through: its optimizer steps as a progress task,
    its logs to the run's trackers at the run's step."""
    from .tracking.trainer import TrackedLogs
    from .trainer_progress import StepProgress

    return [StepProgress(f"{stage}: training steps"), TrackedLogs()]


def _sharding_arguments(model: ModelConfig) -> dict[str, Any]:
    """Under a launch that asks for FSDP: accelerate's state set up for it now (on a CPU too,
    where accelerate alone would run DDP), and the trainer told to use that state."""
    from accelerate.utils import parse_flag_from_env

    from .sharding import LORA_REFUSED, make_accelerator

    if not parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return {}
    if model.lora_r:
        raise ValueError(LORA_REFUSED)
    make_accelerator("no")  # the trainers' mixed precision: bf16 is off (above)
    return {"accelerator_config": {"use_configured_state": True}}


def stage_version(stage: str, config: BaseModel, data: dict[str, str]) -> str:
    """A version that names what was trained: the stage, its config and its data."""
    payload = json.dumps([config.model_dump(mode="json"), data], sort_keys=True)
    return f"{stage}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def already_published(out_dir: Path, stage: str, config: BaseModel) -> bool:
    """True when ``out_dir`` holds this stage's checkpoint for this config (a rerun resumes);
    raises when it holds another one, so nothing is silently reused or overwritten."""
    if not is_published(out_dir):
        return False
    manifest = read_manifest(out_dir)
    if manifest.stage != stage or manifest.config != config.model_dump(mode="json"):
        raise FileExistsError(
            f"{out_dir} already holds a {manifest.stage!r} checkpoint of another config "
            f"({manifest.version}); choose another output folder"
        )
    console.print(f"[bold]codepost[/bold]: {stage}: {out_dir} is already published, reusing it")
    return True


def stage_manifest(
    stage: str, config: BaseModel, parent: str, data: dict[str, str], metrics: dict[str, Any]
) -> CheckpointManifest:
    return CheckpointManifest(
        stage=stage,
        version=stage_version(stage, config, data),
        parent=parent,
        config=config.model_dump(mode="json"),
        data=data,
        metrics=metrics,
    )


def logged_losses(trainer: Trainer) -> list[float]:
    """The loss logged every ``logging_steps`` (averaged over the ranks): the curve to compare."""
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def saved_dtype(save_dtype: str, parent: str) -> torch.dtype | None:
    """The dtype to publish weights trained from ``parent`` in: ``save_dtype``, or with
    ``base`` the dtype the lineage's first model declares in its config.json (None when it
    declares none: the weights stay as they trained)."""
    import torch
    from transformers import AutoConfig

    if save_dtype != "base":
        return getattr(torch, save_dtype)
    base = lineage_base(parent) or parent
    declared = AutoConfig.from_pretrained(resolve_model(base)).dtype
    return getattr(torch, declared) if isinstance(declared, str) else declared


def publish_trained(
    out_dir: Path, trainer: Trainer, manifest: CheckpointManifest, save_dtype: str = "base"
) -> None:
    """Publish a trained model for serving, from the main process, in ``save_dtype``
    (:func:`saved_dtype`), its optimizer steps in the manifest; every rank calls it (under FSDP
    the shards are gathered) and none returns before the checkpoint exists. The trainers turn
    the KV cache off for training, and a checkpoint saved that way generates without it (many
    times slower)."""
    sharded = trainer.accelerator.is_fsdp2
    weights = trainer.accelerator.get_state_dict(trainer.model) if sharded else None
    if sharded:
        console.print(
            f"{manifest.stage}: whole weights gathered from the FSDP2 shards of "
            f"{trainer.accelerator.num_processes} ranks"
        )
    if trainer.accelerator.is_main_process:
        model: Any = trainer.model  # a PreTrainedModel, or a PEFT model around one
        model.config.use_cache = True
        publish_model(
            out_dir,
            model,
            trainer.processing_class,
            manifest.model_copy(update={"steps": trainer.state.global_step}),
            state_dict=weights,
            dtype=saved_dtype(save_dtype, str(manifest.parent)),
        )
    trainer.accelerator.wait_for_everyone()
