"""The RL stage: ``for each iteration: sample -> score -> update -> refresh``, written once for
GRPO, RLOO, REINFORCE++ and PPO (CleanRL's ``ppo.py`` shape: read it top to bottom).

Dynamic sampling (DAPO; verl's ``filter_groups``): a group whose samples all pass, or all fail,
teaches nothing about passing, so it is dropped before the update, and more prompts are
sampled, for a bounded number of extra rounds, until the batch holds ``prompts_per_iteration``
informative groups. What "all the same" looks at is ``dynamic_sampling_metric``: the test
outcome by default (verl's ``filter_groups.metric=acc``), not the total reward, whose small
format and syntax terms make almost every group differ, so that all-fail groups would train on
the shaping terms alone. On a weak model most groups are uniform; without this most of the
update's time goes to rows with no signal about the tests.

The sampler is the process-wide engine (vLLM, or transformers ``generate``), refreshed in
place with the new weights after every update and checked with a probe. Each iteration
publishes a checkpoint (safetensors + manifest, with the trainer state that continues
training exactly) and appends a metrics row; the curves are redrawn as PNG. A run that was
stopped resumes after its last published iteration.

On N ranks (``accelerate launch``, DDP): the main process samples with one engine, or every rank
samples its share of the prompts with an engine of its own (``samplers``: vLLM data parallel,
colocated, as TRL's colocate mode); every rank scores its share of the rows on its own sandbox
pool and gets them all back; every rank updates on its share of each minibatch (the weights do
not depend on N); the main process alone writes (rollouts, checkpoint, trainer state, metrics),
and every engine is refreshed from the published checkpoint. The trainer state is whole (not
sharded), so a run resumes on any number of ranks.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list, gather_object
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...verifiers import RewardConfig
from ...verifiers.problems import MBPP
from .. import atomic
from ..checkpoints.manifest import (
    CheckpointManifest,
    is_published,
    publish,
    read_manifest,
    sha256_file,
    write_model,
)
from ..checkpoints.registry import delete
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import Prompt, PromptStyle, build_prompt
from ..data.rows import SCORED_COLUMNS, TO_TRAIN, read_rows, read_table, write_rows, write_table
from ..inference.sampling import (
    EngineConfig,
    SamplingConfig,
    check_room,
    get_sampler,
    probe_ids,
)
from ..inference.sampling import Sampler as Engine
from ..model_config import ModelConfig, load_causal_lm, load_tokenizer
from ..progress import Task
from ..reporting.plots import plot_curves
from ..rl.metric_names import ITERATION, Data, Reward, Sampler, Time, Update, lookup
from ..rl.models import ValueModel
from ..rl.policy_update import PolicyUpdater, UpdateConfig
from ..rl.rollouts import collate_rollouts
from ..rl.trainer_state import gather_trainer_state, has_trainer_state, load_trainer_state
from ..tracking import log_stage_metrics
from .difficulty_filter import kept_problems
from .registry import Artifacts, Stage, register, with_weights
from .scoring import ScoreConfig, score_rollouts, summarize

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "reward_curve.png"

GroupMetric = Literal["pass", "tests", "reward"]
# The scored column each dynamic-sampling metric reads.
GROUP_METRIC_COLUMNS: dict[GroupMetric, str] = {
    "pass": "passed",
    "tests": "pass_fraction",
    "reward": "reward",
}


class RLConfig(BaseModel):
    """An RL run: the model, its problems, how it samples, scores and updates, how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = Field(default_factory=ModelConfig)
    problems: ProblemSet = Field(
        default_factory=lambda: ProblemSet(source=MBPP, split="train", shuffle_seed=0)
    )
    prompt_style: PromptStyle = "chat"
    iterations: int | None = Field(
        5, ge=1, le=100_000, description="policy updates; null when `epochs` sets the length"
    )
    epochs: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description="the run's length in passes over the problems (set iterations: null): "
        "iterations = ceil(epochs x problems / prompts_per_iteration); each pass reshuffles, so "
        "the sampler sees every problem again",
    )
    prompts_per_iteration: int = Field(8, ge=1, le=4096, description="groups (prompts) per update")
    dynamic_sampling: bool = Field(
        True,
        description="drop groups whose `dynamic_sampling_metric` is the same for every sample "
        "before the update and sample more prompts to fill the batch with informative groups "
        "(DAPO)",
    )
    dynamic_sampling_metric: GroupMetric = Field(
        "pass",
        description="what must vary within a group for it to train: pass (whether all tests "
        "passed), tests (the fraction of tests passed) or reward (the total reward, whose "
        "format and syntax terms make all-fail groups differ too)",
    )
    max_sampling_rounds: int = Field(
        3,
        ge=1,
        le=100,
        description="dynamic sampling: sampling rounds per iteration at most (1 = no extra "
        "rounds); an iteration that finds no informative group publishes unchanged weights",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    samplers: Literal["main_process", "every_rank"] = Field(
        "main_process",
        description="on N processes: one engine on the main process samples every prompt, or "
        "an engine on every rank samples its share (vLLM data parallel, colocated: each GPU "
        "holds an engine); the same on one process",
    )
    scoring: ScoreConfig = Field(
        # Small format and syntax terms give a signal while no sample of a group passes yet.
        default_factory=lambda: ScoreConfig(
            reward=RewardConfig(test_weight=1.0, format_weight=0.1, syntax_weight=0.1)
        )
    )
    # A completion cut at max_tokens failed because of the budget, not its code: it still sets
    # its group's baseline but does not train (TRL's mask_truncated_completions). A length
    # penalty stays off: the test reward already favours finishing, and on weak models a length
    # term teaches short answers, not correct ones.
    update: UpdateConfig = Field(default_factory=lambda: UpdateConfig(lr=1e-6, mask_truncated=True))
    save_total_limit: int | None = Field(
        None,
        ge=1,
        description="iteration checkpoints kept: the newest N, older ones deleted as new ones "
        "are published (each holds the weights and a trainer state; AdamW's is twice the "
        "weights in float32); a resume needs the newest only; null keeps them all",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        if (self.iterations is None) == (self.epochs is None):
            raise ValueError(
                "set the run's length once: `iterations` or `epochs` (with iterations: null)"
            )
        if self.sampling.temperature == 0:
            raise ValueError(
                "sampling.temperature=0 samples greedily: the update needs the probabilities "
                "of a sampled distribution (temperature > 0)"
            )
        if self.update.recipe.advantage == "rloo" and self.sampling.num_generations < 2:
            raise ValueError(
                f"sampling.num_generations={self.sampling.num_generations}: the rloo "
                "estimator's leave-one-out baseline needs at least 2 completions per prompt"
            )
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        return self

    def num_iterations(self, num_problems: int) -> int:
        if self.iterations is not None:
            return self.iterations
        assert self.epochs is not None
        return math.ceil(self.epochs * num_problems / self.prompts_per_iteration)


class Phases:
    """Wall time per phase of one iteration (a phase entered twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, metric: str) -> Iterator[None]:
        """Time the block as ``metric`` (one of :attr:`Time.PHASES`)."""
        start = time.perf_counter()
        yield
        self.seconds[metric] = self.seconds.get(metric, 0.0) + time.perf_counter() - start


def iteration_dir(out_dir: Path, iteration: int) -> Path:
    return out_dir / "checkpoints" / f"iteration-{iteration:04d}"


def last_published_iteration(out_dir: Path) -> int:
    """The last iteration whose checkpoint is published (0: none)."""
    done = [
        int(path.name.removeprefix("iteration-"))
        for path in (out_dir / "checkpoints").glob("iteration-*")
        if is_published(path)
    ]
    return max(done, default=0)


def _delete_iterations_up_to(out_dir: Path, last: int) -> None:
    """Delete the checkpoints of iterations 1 to ``last``, published or half deleted by a
    crash; every engine has been refreshed past them."""
    for path in (out_dir / "checkpoints").glob("iteration-*"):
        if int(path.name.removeprefix("iteration-")) <= last:
            delete(path)


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


def group_rows(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Scored rows grouped by prompt, in order of first appearance; excluded rows (sandbox
    errors under ``sandbox_errors="exclude"``) left out."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if not row["excluded"]:
            groups.setdefault(row["prompt_id"], []).append(row)
    return list(groups.values())


def is_informative(group: Sequence[dict[str, Any]], metric: GroupMetric = "pass") -> bool:
    """Whether ``metric`` differs within a group: under ``pass`` a group trains only when some
    samples pass and some fail (the update then learns what passing takes)."""
    column = GROUP_METRIC_COLUMNS[metric]
    return len({float(row[column]) for row in group}) > 1


def uniform_groups(groups: Sequence[Sequence[dict[str, Any]]]) -> dict[str, float]:
    """How many of ``groups`` each metric would drop (``data/groups_uniform/<metric>``): the
    metrics compared on the same groups."""
    return {
        Data.GROUPS_UNIFORM[metric]: float(sum(not is_informative(g, metric) for g in groups))
        for metric in GROUP_METRIC_COLUMNS
    }


def run_rl(config: RLConfig, out_dir: Path) -> Path:
    """Train ``config.num_iterations`` iterations into ``out_dir``; returns the last
    checkpoint."""
    out_dir = Path(out_dir)
    torch.manual_seed(config.seed)

    # Problems and prompts.
    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(config.model)
    prompts = {
        task_id: build_prompt(problem, tokenizer, config.prompt_style)
        for task_id, problem in problems.items()
    }
    schedule = _prompt_schedule(list(prompts), config.prompts_per_iteration, config.seed)
    iterations = config.num_iterations(len(problems))

    # Resume after the last published iteration, with the trainer state it saved.
    start = last_published_iteration(out_dir)
    parent = str(iteration_dir(out_dir, start)) if start else config.model.resolve()
    batches_drawn = _batches_drawn(Path(parent)) if start else 0
    for _ in range(batches_drawn):  # the schedule continues where it was
        next(schedule)
    policy = load_causal_lm(config.model.model_copy(update={"name_or_path": parent}))
    updater = _updater(config.update, config.model, policy)
    accelerator = updater.accelerator
    main = accelerator.is_main_process
    if start:
        load_trainer_state(updater, Path(parent))
        log.info("resuming after iteration %d (%s)", start, parent)
    if main:
        atomic.write_text(out_dir / "config.json", config.model_dump_json(indent=2))
        _metrics_of_published(out_dir, start)
    sampler = (
        get_sampler(config.model, config.engine, checkpoint=parent)
        if main or config.samplers == "every_rank"
        else None
    )
    vocab_size = policy.config.vocab_size
    data = {"problems": fingerprint(problems)}
    shown = Task("rl: iterations", iterations, start)

    for iteration in range(start + 1, iterations + 1):
        phases = Phases()
        scored: list[dict[str, Any]] = []
        groups: list[list[dict[str, Any]]] = []
        seen: list[list[dict[str, Any]]] = []  # every new group sampled, kept or not
        dropped = rounds = 0
        while rounds < config.max_sampling_rounds and len(groups) < config.prompts_per_iteration:
            task_ids = next(schedule)
            batches_drawn += 1
            rounds += 1
            sampling = config.sampling.model_copy(
                update={"seed": config.sampling.seed + batches_drawn}
            )
            with phases(Time.SAMPLE):
                rows, engines = _sample_on_ranks(
                    sampler,
                    [prompts[t] for t in task_ids],
                    sampling,
                    iteration - 1,
                    accelerator,
                    every_rank=config.samplers == "every_rank",
                )
            with phases(Time.SCORE):
                new = _score_on_every_rank(rows, problems, config.scoring, accelerator)
            scored += new
            # A prompt drawn again in a later round (the schedule wraps) stays one group.
            taken = {group[0]["prompt_id"] for group in groups}
            sampled = [group for group in group_rows(new) if group[0]["prompt_id"] not in taken]
            seen += sampled
            kept = (
                [g for g in sampled if is_informative(g, config.dynamic_sampling_metric)]
                if config.dynamic_sampling
                else sampled
            )
            groups += kept
            dropped += len(sampled) - len(kept)
            if not config.dynamic_sampling:
                break
        groups = groups[: config.prompts_per_iteration]
        trained = [row for group in groups for row in group]
        trained_ids = {id(row) for row in trained}
        for row in scored:
            row["trained"] = id(row) in trained_ids
        if main:
            write_rows(
                scored, out_dir / "rollouts" / f"iteration-{iteration:04d}.parquet", SCORED_COLUMNS
            )
        with phases(Time.UPDATE):
            update_metrics = (
                updater.update(collate_rollouts(trained, pad_token_id=tokenizer.pad_token_id))
                if trained
                else {Update.SKIPPED: 1.0}
            )
        if not trained:
            log.warning(
                "iteration %d: no informative group in %d sampling rounds: weights unchanged",
                iteration,
                rounds,
            )
        metrics = {
            ITERATION: iteration,
            **summarize(scored),
            Data.SAMPLING_ROUNDS: float(rounds),
            Data.GROUPS_SAMPLED: float(len({row["prompt_id"] for row in scored})),
            Data.GROUPS_TRAINED: float(len(groups)) if trained else 0.0,
            Data.GROUPS_DROPPED: float(dropped),
            **uniform_groups(seen),
            Data.SCHEDULE_BATCHES: float(batches_drawn),
            Data.EPOCH: batches_drawn * config.prompts_per_iteration / len(problems),
            Sampler.ENGINES: float(engines),
            **update_metrics,
        }
        target = iteration_dir(out_dir, iteration)
        manifest = CheckpointManifest(
            stage=f"rl-{config.update.algorithm}",
            version=f"iteration-{iteration:04d}",
            parent=parent,
            config=config.model_dump(mode="json"),
            data=data,
            metrics=metrics,
        )
        parent = str(target)
        with phases(Time.SAVE):
            _publish(updater, tokenizer, target, manifest, iteration)
        with phases(Time.REFRESH):
            probe = updater.probe_logprobs(probe_ids(vocab_size))  # every rank: collective
            probe_diff = sampler.refresh(target, probe) if sampler is not None else None
            probe_diffs = gather_object([probe_diff])  # every engine's (one process: as is)
        shown.advance()
        if not main:
            continue
        if config.save_total_limit:
            _delete_iterations_up_to(out_dir, iteration - config.save_total_limit)
        metrics[Sampler.REFRESH_PROBE_DIFF] = max(d for d in probe_diffs if d is not None)
        metrics.update(phases.seconds)
        _record(out_dir, metrics)
        log.info(
            "iteration %d/%d: reward %.3f, pass rate %.3f, groups trained %d (dropped %d under "
            "%s, %d rounds; uniform in reward %d), sampler/trainer |dlogp| %.2g, %s",
            iteration,
            iterations,
            metrics[Reward.MEAN],
            metrics[Reward.PASS_RATE],
            metrics[Data.GROUPS_TRAINED],
            dropped,
            config.dynamic_sampling_metric,
            rounds,
            metrics[Data.GROUPS_UNIFORM_REWARD],
            metrics.get(Sampler.LOGPROB_DIFF_MEAN, float("nan")),
            ", ".join(f"{k} {v:.1f}" for k, v in phases.seconds.items()),
        )
    shown.end()
    return iteration_dir(out_dir, iterations)


def _sample_on_ranks(
    sampler: Engine | None,
    prompts: list[Prompt],
    sampling: SamplingConfig,
    policy_version: int,
    accelerator: Accelerator,
    every_rank: bool,
) -> tuple[list[dict[str, Any]], int]:
    """Every prompt's rows on every rank, in prompt order, and how many engines sampled them:
    the main process's engine samples them all, or (an engine on every rank) each rank samples
    a contiguous share. (On one process the collectives hand their input back.)"""
    rank, world = accelerator.process_index, accelerator.num_processes
    if not every_rank:
        rows = sampler.sample(prompts, sampling, policy_version=policy_version) if sampler else []
        [rows] = broadcast_object_list([rows])
        return rows, 1
    assert sampler is not None
    share = math.ceil(len(prompts) / world)
    mine = prompts[rank * share : (rank + 1) * share]
    rows = sampler.sample(mine, sampling, policy_version=policy_version) if mine else []
    shares = gather_object([rows])
    return [row for share_rows in shares for row in share_rows], sum(map(bool, shares))


def _score_on_every_rank(
    rows: list[dict[str, Any]],
    problems: dict[str, Any],
    scoring: ScoreConfig,
    accelerator: Accelerator,
) -> list[dict[str, Any]]:
    """``rows`` (the same on every rank), scored: on N ranks every rank scores rows ``rank::N``
    on its own sandbox pool, and every rank gets all of them back in order (a verdict depends on
    its row alone, so the split changes nothing)."""
    rank, world = accelerator.process_index, accelerator.num_processes
    shares = gather_object([score_rollouts(rows[rank::world], problems, scoring)])
    return [shares[index % world][index // world] for index in range(len(rows))]


def _metrics_of_published(out_dir: Path, last: int) -> None:
    """``metrics.jsonl`` with exactly one row per published iteration: a run killed between
    publishing an iteration and recording its row gets the row back from the iteration's
    manifest (without the times measured after it), and rows of iterations that were never
    published are dropped."""
    path = out_dir / METRICS_FILE
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = {row[ITERATION]: row for row in map(json.loads, filter(str.strip, lines))}
    kept = [
        rows.get(i) or {ITERATION: i, **read_manifest(iteration_dir(out_dir, i)).metrics}
        for i in range(1, last + 1)
    ]
    if kept != [json.loads(line) for line in lines if line.strip()]:
        atomic.write_text(path, "".join(json.dumps(row) + "\n" for row in kept))


def _batches_drawn(checkpoint: Path) -> int:
    """Prompt batches the schedule had handed out when ``checkpoint`` was published (one per
    iteration before dynamic sampling recorded it)."""
    manifest = read_manifest(checkpoint)
    drawn = lookup(manifest.metrics, Data.SCHEDULE_BATCHES)
    return int(drawn) if drawn is not None else int(manifest.version.removeprefix("iteration-"))


def merge_rollouts(out_dir: Path) -> Path:
    """Every iteration's scored rollouts as one Parquet file (``rollouts.parquet``), e.g. to
    mine DPO pairs from what RL sampled."""
    import pyarrow as pa

    files = sorted((Path(out_dir) / "rollouts").glob("iteration-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{out_dir}/rollouts: no RL rollouts to merge")
    # Files of older runs lack the `trained` column: null there.
    tables = [read_table(f, SCORED_COLUMNS) for f in files]
    merged = pa.concat_tables(tables, promote_options="default")
    return write_table(merged, Path(out_dir) / "rollouts.parquet", SCORED_COLUMNS)


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
    published in ``out_dir`` (reused when it is already there for this config).

    Rank-aware under ``accelerate launch``: every rank reads every row, and the updater trains
    each rank on its share of every minibatch (rows ``rank::world``, DDP summing the gradients),
    so the weights do not depend on the number of ranks; the main process alone publishes."""
    from ..training import already_published

    stage = f"update-{config.update.algorithm}"
    out_dir = Path(out_dir)
    if already_published(out_dir, stage, config):
        return out_dir
    rows = read_rows(scored, (*TO_TRAIN, "excluded"))
    # The rows the loop trained on (dynamic sampling drops uniform groups); all, in older files.
    kept = [row for row in rows if not row["excluded"] and row.get("trained", True)]
    if not kept:
        raise ValueError(f"{scored}: every row is excluded (sandbox errors): nothing to learn")
    torch.manual_seed(config.seed)
    parent = config.model.resolve()
    tokenizer = load_tokenizer(config.model)
    updater = _updater(config.update, config.model, load_causal_lm(config.model))
    if has_trainer_state(Path(parent)):
        load_trainer_state(updater, Path(parent))
    version = max(int(row.get("policy_version") or 0) for row in kept) + 1
    metrics = {
        **summarize(rows),
        **updater.update(collate_rollouts(kept, pad_token_id=tokenizer.pad_token_id)),
    }
    manifest = CheckpointManifest(
        stage=stage,
        version=f"policy-{version:04d}",
        parent=parent,
        config=config.model_dump(mode="json"),
        data={"rollouts": sha256_file(Path(scored))},
        metrics=metrics,
    )
    _publish(updater, tokenizer, out_dir, manifest, version)
    log.info("update %s on %d rollouts: %s", stage, len(kept), out_dir)
    return out_dir


def _updater(update: UpdateConfig, model: ModelConfig, policy: PreTrainedModel) -> PolicyUpdater:
    """The updater of ``policy``: a critic when the algorithm trains one, and ``model`` as the
    frozen reference when the KL needs one (with LoRA the reference is the policy without its
    adapter)."""
    critic = ValueModel.from_policy(policy) if update.needs_critic else None
    reference = load_causal_lm(model) if update.needs_reference and not model.lora_r else None
    return PolicyUpdater(update, policy, model_config=model, ref_model=reference, critic=critic)


def _publish(
    updater: PolicyUpdater,
    tokenizer: Any,
    target: Path,
    manifest: CheckpointManifest,
    policy_version: int,
) -> None:
    """A checkpoint of the policy (LoRA merged) and the state to continue from. Every rank
    calls it (under FSDP the shards are gathered); the main process writes, and no rank
    returns before the checkpoint exists."""
    weights = updater.policy_state()
    state = gather_trainer_state(updater, policy_version=policy_version)

    def write(folder: Path) -> None:
        write_model(folder, updater.policy, tokenizer, state_dict=weights)
        state.save(folder)

    if updater.accelerator.is_main_process:
        publish(target, write, manifest)
    updater.accelerator.wait_for_everyone()


def _record(out_dir: Path, metrics: dict[str, Any]) -> None:
    """Append the iteration's metrics and redraw the curves from the whole file."""
    path = out_dir / METRICS_FILE
    atomic.append_line(path, json.dumps(metrics))
    log_stage_metrics(metrics, step=metrics[ITERATION])  # to the trackers of `report_to`
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    plot_curves(
        rows,
        out_dir / CURVES_FILE,
        x=ITERATION,
        panels={
            "reward and pass rate": [Reward.MEAN, Reward.PASS_RATE],
            "groups per update": [
                Data.GROUPS_SAMPLED,
                Data.GROUPS_TRAINED,
                Data.GROUPS_DROPPED,
                Data.GROUPS_UNIFORM_REWARD,
            ],
            "sampler vs trainer": [Sampler.LOGPROB_DIFF_MEAN, Update.KL_REF, Update.APPROX_KL],
            "seconds per phase": list(Time.PHASES),
        },
        title="RL iterations",
    )


def _rl_stage(config: RLConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    config = kept_problems(with_weights(config, inputs.checkpoint), inputs.problems)
    checkpoint = run_rl(config, out_dir)
    state = PartialState()
    scored = merge_rollouts(out_dir) if state.is_main_process else out_dir / "rollouts.parquet"
    state.wait_for_everyone()
    return Artifacts(checkpoint=str(checkpoint), scored=str(scored))


def _update_stage(config: UpdateStageConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    if inputs.scored is None:
        raise ValueError("update: no scored rollouts to update on")
    updated = run_update(with_weights(config, inputs.checkpoint), Path(inputs.scored), out_dir)
    return Artifacts(checkpoint=str(updated))


register(
    Stage(
        name="rl",
        config=RLConfig,
        run=_rl_stage,
        needs=(),
        uses=("checkpoint", "problems"),
        makes=("checkpoint", "scored"),
        extendable=("iterations", "epochs"),
        multi_process=True,
        description="sample, score and update in a loop (GRPO, RLOO, REINFORCE++, PPO)",
    )
)
register(
    Stage(
        name="update",
        config=UpdateStageConfig,
        run=_update_stage,
        needs=("scored",),
        uses=("checkpoint",),
        makes=("checkpoint",),
        multi_process=True,
        description="one policy update on scored rollouts",
    )
)
