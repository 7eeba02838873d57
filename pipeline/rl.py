"""The RL stage: ``for each iteration: sample -> score -> update -> refresh``, written once for
GRPO, RLOO, REINFORCE++ and PPO (CleanRL's ``ppo.py`` shape: read it top to bottom).

The sampler is the process-wide engine (vLLM, or transformers ``generate``), refreshed in
place with the new weights after every update and checked with a probe. Each iteration
publishes a checkpoint (safetensors + manifest, with the trainer state that continues
training exactly) and appends a metrics row; the curves are redrawn as PNG. A run that was
stopped resumes after its last published iteration.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from codepost.pipeline import checkpoints
from codepost.pipeline.data import ProblemSet, fingerprint, load_problem_set
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer
from codepost.pipeline.models import ValueModel
from codepost.pipeline.plots import plot_curves
from codepost.pipeline.policy_update import PolicyUpdater, UpdateConfig
from codepost.pipeline.prompts import PromptStyle, build_prompt
from codepost.pipeline.rollouts import collate_rollouts
from codepost.pipeline.sampling import (
    EngineConfig,
    SamplingConfig,
    get_sampler,
    trainer_probe_logprobs,
)
from codepost.pipeline.scoring import ScoreConfig, score_rollouts, summarize
from codepost.verifiers import RewardConfig
from codepost.verifiers.problems import MBPP

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.pt"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "reward_curve.png"


class RLConfig(BaseModel):
    """An RL run: the model, its problems, how it samples, scores and updates, how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = Field(default_factory=ModelConfig)
    problems: ProblemSet = Field(
        default_factory=lambda: ProblemSet(source=MBPP, split="train", shuffle_seed=0)
    )
    prompt_style: PromptStyle = "chat"
    iterations: int = Field(5, ge=1, le=100_000)
    prompts_per_iteration: int = Field(8, ge=1, le=4096)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scoring: ScoreConfig = Field(
        # Small format and syntax terms give a signal while no sample of a group passes yet.
        default_factory=lambda: ScoreConfig(
            reward=RewardConfig(test_weight=1.0, format_weight=0.1, syntax_weight=0.1)
        )
    )
    update: UpdateConfig = Field(default_factory=lambda: UpdateConfig(lr=1e-6))
    seed: int = 0


class Phases:
    """Wall time per phase of one iteration."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[f"time_{name}_s"] = time.perf_counter() - start


def iteration_dir(out_dir: Path, iteration: int) -> Path:
    return out_dir / "checkpoints" / f"iteration-{iteration:04d}"


def last_published_iteration(out_dir: Path) -> int:
    """The last iteration whose checkpoint is published (0: none)."""
    done = [
        int(path.name.removeprefix("iteration-"))
        for path in (out_dir / "checkpoints").glob("iteration-*")
        if checkpoints.is_published(path)
    ]
    return max(done, default=0)


def _prompt_schedule(task_ids: list[str], per_iteration: int, seed: int) -> Iterator[list[str]]:
    """Task ids for each iteration: passes over a shuffled list, reshuffled every pass; no task
    twice in one iteration (a group is one prompt's samples)."""
    if per_iteration > len(task_ids):
        raise ValueError(
            f"prompts_per_iteration={per_iteration} exceeds the {len(task_ids)} problems"
        )
    rng = random.Random(seed)
    pool: list[str] = []
    while True:
        batch: list[str] = []
        while len(batch) < per_iteration:
            if not pool:
                fresh = [t for t in task_ids if t not in batch]
                rng.shuffle(fresh)
                pool = [t for t in task_ids if t in batch] + fresh  # pop() takes from the end
            batch.append(pool.pop())
        yield batch


def run_rl(config: RLConfig, out_dir: Path) -> Path:
    """Train ``config.iterations`` iterations into ``out_dir``; returns the last checkpoint."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(config.model_dump_json(indent=2))
    torch.manual_seed(config.seed)

    # Problems and prompts.
    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(config.model)
    prompts = {
        task_id: build_prompt(problem, tokenizer, config.prompt_style)
        for task_id, problem in problems.items()
    }
    schedule = _prompt_schedule(list(prompts), config.prompts_per_iteration, config.seed)

    # Resume after the last published iteration, with the trainer state it saved.
    start = last_published_iteration(out_dir)
    parent = str(iteration_dir(out_dir, start)) if start else config.model.resolve()
    for _ in range(start):  # the schedule continues where it was
        next(schedule)
    policy = load_causal_lm(config.model.model_copy(update={"name_or_path": parent}))
    updater = _updater(config.update, config.model, policy)
    if start:
        _load_trainer_state(updater, Path(parent) / TRAINER_STATE)
        log.info("resuming after iteration %d (%s)", start, parent)
    sampler = get_sampler(config.model, config.engine, checkpoint=parent)
    vocab_size = policy.config.vocab_size
    data = {"problems": fingerprint(problems)}

    for iteration in range(start + 1, config.iterations + 1):
        phases = Phases()
        task_ids = next(schedule)
        sampling = config.sampling.model_copy(update={"seed": config.sampling.seed + iteration})

        with phases("sample"):
            rows = sampler.sample(
                [prompts[t] for t in task_ids], sampling, policy_version=iteration - 1
            )
        with phases("score"):
            scored = score_rollouts(rows, problems, config.scoring)
        _save_rollouts(scored, out_dir / "rollouts" / f"iteration-{iteration:04d}.parquet")
        with phases("update"):
            kept = [row for row in scored if not row["excluded"]]
            update_metrics = (
                updater.update(collate_rollouts(kept, pad_token_id=tokenizer.pad_token_id))
                if kept
                else {}
            )
        metrics = {"iteration": iteration, **summarize(scored), **update_metrics}
        target = iteration_dir(out_dir, iteration)
        manifest = checkpoints.CheckpointManifest(
            stage=f"rl-{config.update.algorithm}",
            version=f"iteration-{iteration:04d}",
            parent=parent,
            config=config.model_dump(mode="json"),
            data=data,
            metrics=metrics,
        )
        with phases("save"):
            _publish(updater, tokenizer, target, manifest, iteration)
        with phases("refresh"):
            expected = trainer_probe_logprobs(updater.policy, vocab_size)
            metrics["refresh_probe_diff"] = sampler.refresh(target, expected)
        metrics.update(phases.seconds)
        _record(out_dir, metrics)
        log.info(
            "iteration %d/%d: reward %.3f, pass rate %.3f, sampler/trainer |dlogp| %.2g, %s",
            iteration,
            config.iterations,
            metrics["reward_mean"],
            metrics["pass_rate"],
            metrics.get("sampler_logprob_diff_mean", float("nan")),
            ", ".join(f"{k[5:-2]} {v:.1f}s" for k, v in phases.seconds.items()),
        )
        parent = str(target)
    return iteration_dir(out_dir, config.iterations)


class UpdateStageConfig(BaseModel):
    """One policy update on scored rollouts: the RL loop's update as a stage of its own (when
    sampling and scoring run elsewhere, or to replay a rollouts file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the policy that sampled the rollouts; an RL checkpoint continues its "
        "optimizer, KL controller and RNG state",
    )
    update: UpdateConfig = Field(default_factory=UpdateConfig)
    seed: int = 0


def run_update(config: UpdateStageConfig, scored: Path, out_dir: Path) -> Path:
    """One update of ``config.model`` on a scored rollouts Parquet file; the new checkpoint is
    published in ``out_dir`` (reused when it is already there for this config)."""
    from datasets import Dataset

    from codepost.pipeline.training import already_published

    stage = f"update-{config.update.algorithm}"
    out_dir = Path(out_dir)
    if already_published(out_dir, stage, config):
        return out_dir
    rows = Dataset.from_parquet(str(scored)).to_list()
    if "reward" not in (rows[0] if rows else {}):
        raise ValueError(f"{scored}: no scored rollouts (score them first: the score stage)")
    kept = [row for row in rows if not row["excluded"]]
    if not kept:
        raise ValueError(f"{scored}: every row is excluded (sandbox errors): nothing to learn")
    torch.manual_seed(config.seed)
    parent = config.model.resolve()
    tokenizer = load_tokenizer(config.model)
    updater = _updater(config.update, config.model, load_causal_lm(config.model))
    state = Path(parent) / TRAINER_STATE
    if state.is_file():
        _load_trainer_state(updater, state)
    version = max(int(row.get("policy_version") or 0) for row in kept) + 1
    metrics = {
        **summarize(rows),
        **updater.update(collate_rollouts(kept, pad_token_id=tokenizer.pad_token_id)),
    }
    manifest = checkpoints.CheckpointManifest(
        stage=stage,
        version=f"policy-{version:04d}",
        parent=parent,
        config=config.model_dump(mode="json"),
        data={"rollouts": checkpoints.sha256_file(Path(scored))},
        metrics=metrics,
    )
    _publish(updater, tokenizer, out_dir, manifest, version)
    log.info("update %s on %d rollouts: %s", stage, len(kept), out_dir)
    return out_dir


def _updater(update: UpdateConfig, model: ModelConfig, policy: torch.nn.Module) -> PolicyUpdater:
    """The updater of ``policy``: a critic for PPO, and ``model`` as the frozen reference when
    the KL needs one (with LoRA the reference is the policy without its adapter)."""
    critic = ValueModel.from_policy(policy) if update.algorithm == "ppo" else None
    needs_reference = update.kl_in != "none" and not model.lora_r
    reference = load_causal_lm(model) if needs_reference else None
    return PolicyUpdater(update, policy, model_config=model, ref_model=reference, critic=critic)


def _save_rollouts(rows: list[dict[str, Any]], path: Path) -> None:
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))


def _publish(
    updater: PolicyUpdater,
    tokenizer: Any,
    target: Path,
    manifest: checkpoints.CheckpointManifest,
    policy_version: int,
) -> None:
    """A checkpoint of the policy (LoRA merged) and the state to continue from."""

    def write(folder: Path) -> None:
        checkpoints.write_model(folder, updater.policy, tokenizer)
        torch.save(
            {
                "policy_version": policy_version,
                "optimizer": updater.optimizer.state_dict(),
                "kl_coef": updater.kl_controller.value,
                "generator": updater.generator.get_state(),
                "critic": updater.critic.state_dict() if updater.critic is not None else None,
            },
            folder / TRAINER_STATE,
        )

    checkpoints.publish(target, write, manifest)


def _load_trainer_state(updater: PolicyUpdater, path: Path) -> None:
    state = torch.load(path, weights_only=False)
    updater.optimizer.load_state_dict(state["optimizer"])
    updater.kl_controller.value = state["kl_coef"]
    updater.generator.set_state(state["generator"])
    if state["critic"] is not None and updater.critic is not None:
        updater.critic.load_state_dict(state["critic"])


def _record(out_dir: Path, metrics: dict[str, Any]) -> None:
    """Append the iteration's metrics and redraw the curves from the whole file."""
    path = out_dir / METRICS_FILE
    with path.open("a") as stream:
        stream.write(json.dumps(metrics) + "\n")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    plot_curves(
        rows,
        out_dir / CURVES_FILE,
        x="iteration",
        panels={
            "reward and pass rate": ["reward_mean", "pass_rate"],
            "sampler vs trainer": ["sampler_logprob_diff_mean", "kl_ref", "approx_kl"],
            "seconds per phase": [k for k in rows[-1] if k.startswith("time_")],
        },
        title="RL iterations",
    )
