"""Rejection-sampling fine-tuning (RFT) and expert iteration: sample k completions per problem,
keep the ones that pass every test, fine-tune on them with the SFT trainer, and repeat.

The cheap baseline RL has to beat: expert iteration matches PPO on reasoning tasks (Havrilla
et al. 2024), and most of GRPO's gain over RFT comes from dropping prompts whose samples all
fail (Xiong et al. 2025). Each round samples ``sampling.num_generations`` completions of every
problem from the newest checkpoint, scores them in the sandbox, and adds the passing ones
(deduplicated, at most ``max_per_problem`` per problem over all rounds, completions cut at
``max_tokens`` left out) to the examples. Then it fine-tunes the stage's *input* checkpoint on
all the examples found so far (STaR's restart: a round does not compound the previous round's
drift), and publishes the round's checkpoint. Layout of ``out_dir``, every file reused by a
rerun (more ``rounds`` continue in the same folder)::

    round-01/rollouts.parquet  round-01/scored.parquet  round-01/examples.jsonl
    round-01/checkpoint/   (published: weights + manifest)   round-02/ ...   metrics.jsonl
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ...settings.config import Seed
from .. import atomic
from ..checkpoints.manifest import read_manifest
from ..data.rows import read_rows
from ..inference.sampling import SamplingConfig
from ..model_config import load_tokenizer
from ..training import (
    TrainingSettings,
    already_published,
    logged_losses,
    publish_trained,
    stage_manifest,
)
from .registry import Artifacts, Stage, kept_problems, register, with_weights
from .rollouts import RolloutsConfig, run_rollouts
from .sft import SFTStageConfig, sft_trainer

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EXAMPLES_FILE = "examples.jsonl"
TO_KEEP = ("prompt_id", "prompt", "completion", "passed", "finish_reason")


class RFTConfig(RolloutsConfig):
    """What each round samples (problems, k = ``sampling.num_generations``, engine, scoring),
    what it keeps, how it fine-tunes, and how many rounds."""

    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(num_generations=8, temperature=1.0, max_tokens=256),
        description="k completions per problem and round (num_generations), as RL samples",
    )
    rounds: int = Field(
        1, ge=1, le=100, description="rounds of sample -> keep the passes -> fine-tune (R)"
    )
    max_per_problem: int = Field(
        4, ge=1, le=1024, description="passing completions kept per problem, over all rounds (m)"
    )
    first_round: Literal["sample", "scored"] = Field(
        "sample",
        description="sample: round 1 samples from the input checkpoint; scored: round 1 keeps "
        "the passes of the scored rollouts an earlier stage made (its own sampling skipped)",
    )
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    seed: Seed = 0


def round_dir(out_dir: Path, number: int) -> Path:
    return Path(out_dir) / f"round-{number:02d}"


def passing_examples(
    rows: list[dict[str, Any]], taken: list[dict[str, Any]], max_per_problem: int
) -> list[dict[str, Any]]:
    """The prompt/completion examples of ``rows`` that ``taken`` (earlier rounds' examples)
    lacks: completions that passed and stopped on their own, each text once, at most
    ``max_per_problem`` per problem counting ``taken``."""
    seen = {(ex["prompt_id"], ex["completion"].strip()) for ex in taken}
    per_problem: dict[str, int] = {}
    for example in taken:
        per_problem[example["prompt_id"]] = per_problem.get(example["prompt_id"], 0) + 1
    new = []
    for row in rows:
        key = (row["prompt_id"], row["completion"].strip())
        if not row["passed"] or row["finish_reason"] != "stop" or key in seen:
            continue
        if per_problem.get(row["prompt_id"], 0) >= max_per_problem:
            continue
        seen.add(key)
        per_problem[row["prompt_id"]] = per_problem.get(row["prompt_id"], 0) + 1
        new.append(_example(row))
    return new


def _example(row: dict[str, Any]) -> dict[str, Any]:
    """A passing row as training data: its prompt and completion; an episode's tokens as they
    were sampled, with the mask that trains the model's turns only (the environment's replies
    are context, as in RL)."""
    example = {
        "prompt_id": row["prompt_id"],
        "prompt": row["prompt"],
        "completion": row["completion"],
    }
    if row.get("model_mask") is not None:
        example.update(
            input_ids=row["prompt_ids"] + row["completion_ids"],
            completion_mask=[0] * len(row["prompt_ids"]) + row["model_mask"],
            turns=row["turns"],
        )
    return example


def run_rft(config: RFTConfig, out_dir: Path, scored: Path | None = None) -> Path:
    """``config.rounds`` rounds of rejection sampling and fine-tuning into ``out_dir``; returns
    the last round's checkpoint. ``scored`` stands for round 1's samples when
    ``config.first_round`` is "scored"."""
    out_dir = Path(out_dir)
    start = config.model.name_or_path
    examples: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    checkpoint = start
    for number in range(1, config.rounds + 1):
        folder = round_dir(out_dir, number)
        began = time.perf_counter()
        if number == 1 and config.first_round == "scored":
            if scored is None:
                raise ValueError("rft: first_round is 'scored' but no scored rollouts came in")
            rows_file = Path(scored)
        else:
            model = config.model.model_copy(update={"name_or_path": checkpoint})
            sampling = config.sampling.model_copy(update={"seed": config.sampling.seed + number})
            rows_file = run_rollouts(
                config.model_copy(update={"model": model, "sampling": sampling}), folder
            )
        rows = read_rows(rows_file, TO_KEEP)
        sampled_s = time.perf_counter() - began
        new = passing_examples(rows, examples, config.max_per_problem)
        examples += new
        _write_examples(folder / EXAMPLES_FILE, examples)
        if not examples:
            raise ValueError(
                f"rft: no completion of {len({r['prompt_id'] for r in rows})} problems passed "
                f"in round {number} ({len(rows)} samples): nothing to fine-tune on; sample more "
                "(sampling.num_generations) or filter the problems first"
            )
        counts = {
            "round": number,
            "samples": len(rows),
            "pass_rate": sum(bool(r["passed"]) for r in rows) / len(rows),
            "problems_with_a_pass": len({r["prompt_id"] for r in rows if r["passed"]}),
            "new_examples": len(new),
            "examples": len(examples),
            "problems_in_examples": len({ex["prompt_id"] for ex in examples}),
            "repair_examples": sum(ex.get("turns", 1) > 1 for ex in examples),
        }
        began = time.perf_counter()
        # The round's config says how many rounds it is the last of: more rounds reuse it.
        round_config = config.model_copy(update={"rounds": number})
        trained = _fine_tune(round_config, start, examples, folder / "checkpoint", counts)
        checkpoint = str(folder / "checkpoint")
        metrics.append(
            {
                **counts,
                **trained,
                "time/sample_and_score_s": sampled_s,
                "time/train_s": time.perf_counter() - began,
            }
        )
        atomic.write_text(out_dir / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in metrics))
        log.info("rft round %d/%d: %s", number, config.rounds, metrics[-1])
    return Path(checkpoint)


def _fine_tune(
    config: RFTConfig,
    start: str,
    examples: list[dict[str, Any]],
    out: Path,
    counts: dict[str, Any],
) -> dict[str, Any]:
    """``start`` fine-tuned on ``examples`` with the SFT trainer and published in ``out``
    (reused when it is there for this round); the training metrics."""
    from datasets import Dataset

    stage = f"rft-round-{config.rounds:02d}"
    if already_published(out, stage, config):
        return {k: v for k, v in read_manifest(out).metrics.items() if k not in counts}
    sft = SFTStageConfig(
        model=config.model.model_copy(update={"name_or_path": start}),
        problems=config.problems,
        prompt_style=config.prompt_style,
        training=config.training,
    )
    fields = (
        ("input_ids", "completion_mask") if "input_ids" in examples[0] else ("prompt", "completion")
    )
    dataset = Dataset.from_list([{field: e[field] for field in fields} for e in examples])
    with tempfile.TemporaryDirectory(prefix="codepost-rft-") as scratch:
        trainer = sft_trainer(sft, dataset, load_tokenizer(sft.model), Path(scratch))
        result = trainer.train()
    trained = {
        "train_loss": result.training_loss,
        "losses": logged_losses(trainer),
        "steps": result.global_step,
    }
    digest = hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()[:16]
    manifest = stage_manifest(stage, config, start, {"examples": digest}, {**counts, **trained})
    publish_trained(out, trainer, manifest, config.training.save_dtype)
    return trained


def _write_examples(path: Path, examples: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, "".join(json.dumps(e) + "\n" for e in examples))


def _stage(config: RFTConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    config = kept_problems(with_weights(config, inputs.checkpoint), inputs.problems)
    scored = Path(inputs.scored) if inputs.scored and config.first_round == "scored" else None
    return Artifacts(checkpoint=str(run_rft(config, out_dir, scored)))


def _check_inputs(config: RFTConfig, makers: dict[str, str]) -> None:
    if config.first_round == "scored" and "scored" not in makers:
        raise ValueError(
            "first_round is 'scored': put a stage that makes scored rollouts (rollouts, rl) "
            "before it, or sample round 1 (first_round: sample)"
        )


register(
    Stage(
        name="rft",
        config=RFTConfig,
        run=_stage,
        needs=(),
        uses=("checkpoint", "problems", "scored"),
        makes=("checkpoint",),
        extendable=("rounds",),
        description="rejection-sampling fine-tuning: keep the passing samples, fine-tune on "
        "them, repeat (expert iteration)",
        check_inputs=_check_inputs,
    )
)
