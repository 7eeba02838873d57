"""The reward-model stage: a Bradley-Terry reward model trained on the verifier's own pairs, and
measured against the verifier on problems it never saw.

Pairs are mined from scored rollouts as the ``pairs`` stage mines them (:func:`.pairs.mine_pairs`:
a passing completion against a failing one of the same problem, optionally more against fewer
tests passed), and split by problem. TRL's ``RewardTrainer`` fits a scalar head on the model
(``AutoModelForSequenceClassification``, one label) to ``-log sigma(r(x, y_w) - r(x, y_l))``.
Then every sample of the problems it did not train on is scored, and the verifier's verdicts
grade the scores (:func:`..reporting.ranking.ranking_quality`: pairwise accuracy and AUROC
with intervals, calibration). Too few training pairs, or too few held-out problems with a
pass and a fail, are refused before training, with the counts.

The checkpoint is a model folder that plain ``transformers`` loads
(``AutoModelForSequenceClassification.from_pretrained``); its manifest holds the measures and
the problems it trained on, so that an evaluation can keep to the others (best-of-n,
:mod:`..reporting.rerank`; :func:`..reward_models.trained_problems`).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from ...settings.config import Settings
from ..checkpoints.manifest import sha256_file
from ..data.rows import TO_PAIR, read_rows
from ..model_config import ModelConfig, load_tokenizer, safetensors_only
from ..reporting.ranking import RankingQuality, ranking_quality
from ..reward_models import RewardModelScorer, reward_input_ids
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
from .pairs import PairMiningConfig, mine_pairs, split_prompts
from .registry import Artifacts, Stage, register, with_weights

if TYPE_CHECKING:  # datasets and TRL load when the stage runs, not with its config
    from datasets import Dataset
    from trl import RewardTrainer


class RewardModelConfig(Settings):
    """A Bradley-Terry reward model on the verifier's pairs: which model, which pairs, how much
    data is enough, how to optimise."""

    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the causal LM under the scalar head (in a run: the latest checkpoint)",
    )
    pairs: PairMiningConfig = Field(
        default_factory=lambda: PairMiningConfig(
            strategies=["all_pairs"], max_pairs_per_prompt=16, held_out_fraction=0.3
        ),
        description="how pairs are mined, and the share of problems (with pairs) held out to "
        "measure the model on; problems without a pair are held out too",
    )
    min_pairs: int = Field(64, ge=1, description="training pairs at least, else refused")
    min_held_out_problems: int = Field(
        3, ge=1, description="held-out problems with a pass and a fail at least, else refused"
    )
    center_rewards_coefficient: float | None = Field(
        0.01,
        ge=0,
        description="TRL's penalty on (r_w + r_l)^2, keeping scores near 0 so that a weight in "
        "a learned reward term means the same across models; None = off",
    )
    calibration_bins: int = Field(5, ge=1, le=100, description="score bins of the calibration")
    training: TrainingSettings = Field(
        default_factory=lambda: TrainingSettings(
            learning_rate=1e-5, per_device_train_batch_size=4, max_length=512
        )
    )

    @model_validator(mode="after")
    def _full_fine_tuning(self) -> RewardModelConfig:
        if self.model.lora_r:
            raise ValueError(
                "model.lora_r: the reward model trains all its weights (the head is new); "
                "LoRA is not supported here"
            )
        return self


def split_rows(
    rows: list[dict[str, Any]], config: RewardModelConfig
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], Counter[str]]:
    """The training pairs, the held-out samples by problem (those of the problems held out,
    and of those without a pair) and the counts. Sandbox errors are left out of both."""
    pairs_by_prompt, counts = mine_pairs(rows, config.pairs)
    train_ids, held_ids = split_prompts(
        sorted(pairs_by_prompt), config.pairs.held_out_fraction, config.pairs.seed
    )
    train = [pair for prompt_id in train_ids for pair in pairs_by_prompt[prompt_id]]
    held_out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["prompt_id"] not in train_ids and not row.get("excluded"):
            held_out[row["prompt_id"]].append(row)
    counts.update(
        train_problems=len(train_ids),
        held_out_problems=len(held_out),
        held_out_problems_with_pairs=len(held_ids),
    )
    return train, dict(held_out), counts


def drop_too_long(
    pairs: list[dict[str, Any]], tokenizer: Any, max_length: int
) -> tuple[list[dict[str, Any]], int]:
    """The pairs whose both texts fit in ``max_length`` tokens, and how many did not (TRL
    would drop them unannounced)."""
    fits = [
        pair
        for pair in pairs
        if all(
            len(reward_input_ids(tokenizer, pair["prompt"], pair[side])) <= max_length
            for side in ("chosen", "rejected")
        )
    ]
    return fits, len(pairs) - len(fits)


def check_enough(counts: Counter[str], config: RewardModelConfig, rollouts: Path) -> None:
    """Refuse, before training, data too thin to train or to measure a reward model on."""
    train, held = counts["train_pairs"], counts["held_out_problems_with_pairs"]
    if train >= config.min_pairs and held >= config.min_held_out_problems:
        return
    raise ValueError(
        f"reward-model: {rollouts} gives {train} training pairs (min_pairs {config.min_pairs}) "
        f"and {held} held-out problems with a pass and a fail (min_held_out_problems "
        f"{config.min_held_out_problems}): of its {counts['prompts']} problems "
        f"{counts['prompts_with_pairs']} have a pair, {counts['prompts_all_passed']} only "
        f"passing and {counts['prompts_all_failed']} only failing samples, and "
        f"{counts['pairs_too_long']} pairs were longer than training.max_length; sample more "
        "problems or completions (problems within the model's reach), or lower the minimums"
    )


def reward_trainer(
    config: RewardModelConfig, train: Dataset, tokenizer: Any, output_dir: Path
) -> RewardTrainer:
    """TRL's trainer on ``config.model`` with a new scalar head."""
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    source = config.model.resolve()
    model = AutoModelForSequenceClassification.from_pretrained(
        source,
        num_labels=1,
        dtype=config.model.torch_dtype,
        use_safetensors=True if safetensors_only(source) else None,
    )
    args = RewardConfig(
        **trainer_arguments(config.training, config.model, output_dir),
        center_rewards_coefficient=config.center_rewards_coefficient,
    )
    return RewardTrainer(
        model=model,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=trainer_callbacks("reward-model"),
    )


def held_out_quality(
    scorer: RewardModelScorer, held_out: dict[str, list[dict[str, Any]]], config: RewardModelConfig
) -> RankingQuality:
    """The trained model's scores of every held-out sample, graded by the verifier's verdicts."""
    rows = [row for prompt_id in sorted(held_out) for row in held_out[prompt_id]]
    scores = scorer.score([r["prompt"] for r in rows], [r["completion"] for r in rows])
    scored: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for row, score in zip(rows, scores, strict=True):
        scored[row["prompt_id"]].append((score, bool(row["passed"])))
    return ranking_quality(scored, bins=config.calibration_bins, seed=config.pairs.seed)


def run_reward_model(config: RewardModelConfig, rollouts: Path, out_dir: Path) -> Path:
    """Train a reward model on the pairs of ``rollouts`` (scored) and publish it in
    ``out_dir`` with its held-out measures; a rerun finds it published."""
    from datasets import Dataset

    out_dir = Path(out_dir)
    if already_published(out_dir, "reward-model", config):
        return out_dir
    rows = read_rows(rollouts, TO_PAIR)
    train, held_out, counts = split_rows(rows, config)
    tokenizer = load_tokenizer(config.model)
    train, counts["pairs_too_long"] = drop_too_long(train, tokenizer, config.training.max_length)
    counts["train_pairs"] = len(train)
    check_enough(counts, config, rollouts)
    console.print(
        f"reward-model: {len(train)} pairs from {counts['train_problems']} problems; "
        f"{counts['held_out_problems']} problems held out "
        f"({counts['held_out_problems_with_pairs']} with a pass and a fail)"
    )
    dataset = Dataset.from_list(
        [{key: pair[key] for key in ("prompt", "chosen", "rejected")} for pair in train]
    )
    with tempfile.TemporaryDirectory(prefix="codepost-reward-model-") as scratch:
        trainer = reward_trainer(config, dataset, tokenizer, Path(scratch))
        started = time.monotonic()
        result = trainer.train()
        wall_s = round(time.monotonic() - started, 1)
        model: Any = trainer.model  # the PreTrainedModel it was given
        scorer = RewardModelScorer(model.eval(), tokenizer, config.training.max_length)
        quality = held_out_quality(scorer, held_out, config)
    metrics = {
        "counts": dict(counts),
        "train_loss": result.training_loss,
        "losses": logged_losses(trainer),
        "steps": result.global_step,
        "wall_s": wall_s,
        "held_out": quality.model_dump(),
        "train_problems": sorted({pair["prompt_id"] for pair in train}),
    }
    console.print(
        f"reward-model: held out, pairwise accuracy {quality.pairwise_accuracy:.3f} "
        f"{_interval(quality.pairwise_accuracy_ci95)} on {quality.pairs} pairs of "
        f"{quality.problems_with_pairs} problems (p = {quality.pairwise_p_value:.3g} against "
        f"1/2); AUROC {quality.auroc:.3f} {_interval(quality.auroc_ci95)} on "
        f"{quality.samples} samples"
    )
    data = {"scored": sha256_file(Path(rollouts))[:16]}
    manifest = stage_manifest("reward-model", config, config.model.name_or_path, data, metrics)
    publish_trained(out_dir, trainer, manifest, config.training.save_dtype)
    return out_dir


def _interval(interval: tuple[float, float]) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _stage(config: RewardModelConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    if inputs.scored is None:
        raise ValueError("reward-model: no scored rollouts to mine pairs from")
    config = with_weights(config, inputs.checkpoint)
    return Artifacts(reward_model=str(run_reward_model(config, Path(inputs.scored), out_dir)))


register(
    Stage(
        name="reward-model",
        config=RewardModelConfig,
        run=_stage,
        needs=("scored",),
        uses=("checkpoint",),
        makes=("reward_model",),
        description="a Bradley-Terry reward model on the verifier's pass/fail pairs, measured "
        "on held-out problems",
    )
)
