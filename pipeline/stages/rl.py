"""The RL stage: ``for each iteration: sample -> score -> update -> refresh``, written once for
GRPO, RLOO, REINFORCE++ and PPO (CleanRL's ``ppo.py`` shape: read it top to bottom).
:func:`run_rl` is a loop over named steps: :func:`fill_batch` (sample and score),
:func:`train` (the update), :func:`publish` (checkpoint, engines refreshed) and :func:`record`
(the metrics).

Dynamic sampling (DAPO; verl's ``filter_groups``): a group whose samples all pass, or all fail,
teaches nothing about passing, so it is dropped before the update, and more prompts are
sampled, for a bounded number of extra rounds, until the batch holds ``prompts_per_iteration``
informative groups. What "all the same" looks at is ``dynamic_sampling_metric``: the test
outcome by default (verl's ``filter_groups.metric=acc``), not the total reward, whose small
format and syntax terms make almost every group differ, so that all-fail groups would train on
the shaping terms alone. On a weak model most groups are uniform; without this most of the
update's time goes to rows with no signal about the tests.

The sampler is the process-wide engine (vLLM, or transformers ``generate``), refreshed in
place with the new weights after every update and checked with a probe. With ``asynchronous``
it is a process of its own that samples and scores while the trainer updates, at most
``max_staleness`` versions behind (``pipeline/rl/asynchronous.py``); the loop is the same.
Each iteration publishes a checkpoint (safetensors + manifest, with the trainer state that
continues training exactly) and appends a metrics row; the curves are redrawn as PNG. A run
that was stopped resumes after its last published iteration.

On N ranks (``accelerate launch``, DDP): the main process samples with one engine, or every rank
samples its share of the prompts with an engine of its own (``samplers``: vLLM data parallel,
colocated, as TRL's colocate mode); every rank scores its share of the rows on its own sandbox
pool and gets them all back; every rank updates on its share of each minibatch (the weights do
not depend on N); the main process alone writes (rollouts, checkpoint, trainer state, metrics),
and every engine is refreshed from the published checkpoint. The trainer state is whole (not
sharded), so a run resumes on any number of ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from ...settings.config import Seed, Settings
from ...verifiers import Problem, RewardConfig
from ...verifiers.problems import MBPP
from .. import atomic
from ..checkpoints.catalog import delete
from ..checkpoints.manifest import (
    MANIFEST,
    CheckpointManifest,
    drop_state,
    is_published,
    read_manifest,
    sha256_file,
    write_model,
)
from ..checkpoints.manifest import publish as publish_folder
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import Prompt, PromptStyle, build_prompt
from ..data.rows import SCORED_COLUMNS, TO_TRAIN, read_rows, read_table, write_rows, write_table
from ..inference.engines import get_sampler
from ..inference.episodes import EpisodeConfig, check_episodes
from ..inference.sampling import (
    EngineConfig,
    Sampler,
    SamplingConfig,
    check_room,
    probe_ids,
)
from ..model_config import ModelConfig, load_causal_lm, load_tokenizer
from ..progress import track
from ..reporting.plots import plot_curves
from ..rl.asynchronous import AsyncConfig, SampleQueue
from ..rl.metric_names import ITERATION, Data, Reward, Time, Update
from ..rl.metric_names import Sampler as SamplerMetrics
from ..rl.update_config import UpdateConfig
from ..tracking import log_stage_metrics
from ..training import already_published
from .registry import Artifacts, Stage, StaleOutputError, kept_problems, register, with_weights
from .scoring import ScoreConfig, score_rollouts, summarize, with_episodes

if TYPE_CHECKING:  # torch, accelerate and the updater load when the stage runs
    from accelerate import Accelerator
    from transformers import PreTrainedModel

    from ..rl.policy_update import PolicyUpdater

log = logging.getLogger(__name__)
ROLLOUTS = "rollouts"  # each iteration's scored rollouts, in out_dir

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "reward_curve.png"

RANKED_BY = (Reward.PASS_RATE, Reward.MEAN)  # what makes an iteration's checkpoint the best
GroupMetric = Literal["pass", "tests", "reward"]
# The scored column each dynamic-sampling metric reads.
GROUP_METRIC_COLUMNS: dict[GroupMetric, str] = {
    "pass": "passed",
    "tests": "pass_fraction",
    "reward": "reward",
}


class RLConfig(Settings):
    """An RL run: the model, its problems, how it samples, scores and updates, how long."""

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
    episodes: EpisodeConfig = Field(
        default_factory=EpisodeConfig,
        description="each sample an episode of answers and the environment's feedback: only "
        "the model's tokens train, and the group of a problem is its episodes, rewarded on "
        "their final answers",
    )
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
            reward=RewardConfig(weights={"test": 1.0, "format": 0.1, "syntax": 0.1})
        )
    )
    # A completion cut at max_tokens failed because of the budget, not its code: it still sets
    # its group's baseline but does not train (TRL's mask_truncated_completions). A length
    # penalty stays off: the test reward already favours finishing, and on weak models a length
    # term teaches short answers, not correct ones.
    update: UpdateConfig = Field(
        default_factory=lambda: UpdateConfig(learning_rate=1e-6, mask_truncated=True)
    )
    asynchronous: AsyncConfig | None = Field(
        None,
        description="sample and score in a process of its own while the trainer updates, at "
        "most max_staleness policy versions behind ({max_staleness: 1}); null: one after the "
        "other",
    )
    save_total_limit: int | None = Field(
        1,
        ge=1,
        description="iteration checkpoints whose weights are kept: the newest N (and the best, "
        "`save_best`), older ones deleted as new ones are published, and the trainer state "
        "(AdamW's is twice the weights in float32) kept on the newest only: a resume needs "
        "nothing else; null keeps every checkpoint whole",
    )
    save_best: bool = Field(
        True,
        description="keep the weights of the iteration whose policy scored the best pass rate "
        "(then mean reward) on the samples it drew for the next iteration, beside the newest",
    )
    seed: Seed = 0

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
        needed = self.update.estimator.min_group_size
        if self.sampling.num_generations < needed:
            raise ValueError(
                f"sampling.num_generations={self.sampling.num_generations}: the "
                f"{self.update.advantage.name} estimator needs at least {needed} completions "
                "per prompt"
            )
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        check_episodes(self.episodes, self.prompt_style, self.engine)
        if self.asynchronous is not None:
            self._check_asynchronous(self.asynchronous.max_staleness)
        return self

    def _check_asynchronous(self, max_staleness: int) -> None:
        if self.samplers == "every_rank":
            raise ValueError(
                "asynchronous: the sampler is one process of its own beside the trainer; "
                "samplers: every_rank needs the synchronous loop (asynchronous: null)"
            )
        if max_staleness > 0 and not self.update.corrects_off_policy:
            raise ValueError(
                f"asynchronous.max_staleness={max_staleness} trains on rows up to "
                f"{max_staleness} policy versions old: weigh them by pi_old / pi_sampler with "
                "update.sampler_is_cap (e.g. 2.0) or update.policy_loss: {name: decoupled}"
            )

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


def _retain(config: RLConfig, out_dir: Path, metrics: dict[str, Any]) -> None:
    """After the iteration of ``metrics`` is published (every engine refreshed past the older
    ones), with ``save_total_limit``: the checkpoints of all but the newest N and the best
    (``save_best``) deleted, published or half deleted by a crash, and the trainer state of
    the older ones kept dropped. Without, every checkpoint stays whole (an update stage can
    replay any iteration from the one before)."""
    if config.save_total_limit is None:
        return
    last = metrics[ITERATION]
    kept = set(range(last - config.save_total_limit + 1, last + 1))
    best = best_iteration(out_dir, metrics) if config.save_best else None
    for path in (out_dir / "checkpoints").glob("iteration-*"):
        iteration = int(path.name.removeprefix("iteration-"))
        if iteration in kept or iteration == best or iteration > last:
            if iteration < last and is_published(path):
                drop_state(path)
        else:
            delete(path)


def best_iteration(out_dir: Path, metrics: dict[str, Any]) -> int | None:
    """The iteration whose checkpoint scored best: the policy of iteration ``j``'s checkpoint
    drew iteration ``j + 1``'s samples, so its score is their pass rate, then their mean reward
    (the newer wins a tie); None before a checkpoint's samples are scored. ``metrics``: the
    newest iteration's row, not yet in ``metrics.jsonl``. The samples are the schedule's next
    prompts, not a held-out set: an evaluation of the kept checkpoints says which is better."""
    path = out_dir / METRICS_FILE
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = {row[ITERATION]: row for row in map(json.loads, filter(str.strip, lines))}
    rows[metrics[ITERATION]] = metrics

    def score(j: int) -> tuple[float, float, int]:  # NaN (nothing scored) ranks last
        drawn = rows[j + 1]
        pass_rate, reward = (-math.inf if math.isnan(drawn[k]) else drawn[k] for k in RANKED_BY)
        return pass_rate, reward, j

    scored = [j for j in rows if j + 1 in rows]
    return max(scored, key=score) if scored else None


def _prompt_schedule(task_ids: list[str], per_iteration: int, seed: int) -> Iterator[list[str]]:
    """Task ids for each iteration: passes over a shuffled list, reshuffled every pass; no task
    twice in one iteration (a group is one prompt's samples)."""
    if per_iteration > len(task_ids):
        raise ValueError(
            f"prompts_per_iteration={per_iteration} exceeds the {len(task_ids)} problems to "
            "train on: lower it, or give more problems (after a difficulty filter: rate more "
            "problems, or sample each more often, max_samples)"
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


def prompt_schedule(config: RLConfig, task_ids: list[str], drawn: int) -> Iterator[list[str]]:
    """The run's prompt batches after the first ``drawn`` (a resumed run continues there)."""
    schedule = _prompt_schedule(task_ids, config.prompts_per_iteration, config.seed)
    for _ in range(drawn):
        next(schedule)
    return schedule


def problems_and_prompts(config: RLConfig) -> tuple[dict[str, Problem], Any, dict[str, Prompt]]:
    """The run's problems, the model's tokenizer and each problem's prompt."""
    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(config.model)
    prompts = {
        task_id: build_prompt(problem, tokenizer, config.prompt_style)
        for task_id, problem in problems.items()
    }
    return problems, tokenizer, prompts


def engine_for(
    config: RLConfig, tokenizer: Any, problems: dict[str, Problem], checkpoint: str | Path | None
) -> Sampler:
    """The engine that samples the run's rows (episodes, with ``episodes.max_turns`` > 1),
    serving ``checkpoint``'s weights (None: the model's)."""
    return with_episodes(
        get_sampler(
            config.model, config.engine, checkpoint=str(checkpoint or config.model.resolve())
        ),
        tokenizer,
        problems,
        config.episodes,
        config.scoring,
    )


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
    checkpoint. A run stopped earlier resumes after its last published iteration."""
    run = _start(config, Path(out_dir))
    with (
        track("rl: iterations", run.iterations, run.resumed_after) as shown,
        run.queue or contextlib.nullcontext(),
    ):
        for iteration in range(run.resumed_after + 1, run.iterations + 1):
            phases = Phases()
            batch = fill_batch(run, iteration, phases)
            update_metrics = train(run, iteration, batch, phases)
            metrics = {ITERATION: iteration, **batch.metrics(run), **update_metrics}
            probe_diff = publish(run, iteration, metrics, phases)
            shown.advance()
            if run.main:
                record(
                    run,
                    {**metrics, SamplerMetrics.REFRESH_PROBE_DIFF: probe_diff, **phases.seconds},
                )
    return iteration_dir(run.out_dir, run.iterations)


@dataclass
class _Run:
    """What an RL run carries from one iteration to the next."""

    config: RLConfig
    out_dir: Path
    problems: dict[str, Problem]
    prompts: dict[str, Prompt]
    schedule: Iterator[list[str]]  # each iteration's prompts, in rounds
    tokenizer: Any
    updater: PolicyUpdater
    sampler: Sampler | None  # this rank's engine, if it samples in this process
    queue: SampleQueue | None  # asynchronous: the sampler's process and what it sampled
    vocab_size: int  # the policy's: the weight-refresh probe spans it
    iterations: int
    resumed_after: int  # the last iteration published before this run (0: none)
    parent: str  # the checkpoint the next iteration trains from
    batches_drawn: int  # prompt batches the schedule has handed out, over the whole run
    # each iteration's scored rollouts file (relative to out_dir) -> its sha256: every
    # checkpoint's manifest holds all of them so far, so a resume or the merge checks the files
    rollout_digests: dict[str, str]

    @property
    def main(self) -> bool:
        return self.updater.accelerator.is_main_process


def _start(config: RLConfig, out_dir: Path) -> _Run:
    """Problems and prompts, and the policy, trainer state, schedule and engine from where a
    stopped run left them (the last published iteration), or from the model."""
    import torch

    from ..rl.trainer_state import load_trainer_state

    torch.manual_seed(config.seed)
    problems, tokenizer, prompts = problems_and_prompts(config)
    start = last_published_iteration(out_dir)
    parent = str(iteration_dir(out_dir, start)) if start else config.model.resolve()
    batches_drawn = _batches_drawn(Path(parent)) if start else 0
    schedule = prompt_schedule(config, list(prompts), batches_drawn)
    policy = load_causal_lm(config.model.model_copy(update={"name_or_path": parent}))
    updater = _updater(config.update, config.model, policy)
    main = updater.accelerator.is_main_process
    if config.asynchronous is not None and updater.accelerator.num_processes > 1:
        raise ValueError(
            "asynchronous: the trainer is one process beside the sampler's; launch it with "
            f"launch.num_processes: 1 (it has {updater.accelerator.num_processes})"
        )
    if start:
        load_trainer_state(updater, Path(parent))
        log.info("resuming after iteration %d (%s)", start, parent)
    if main:
        atomic.write_text(out_dir / "config.json", config.model_dump_json(indent=2))
        _metrics_of_published(out_dir, start)
    in_process = config.asynchronous is None and (main or config.samplers == "every_rank")
    iterations = config.num_iterations(len(problems))
    return _Run(
        config=config,
        out_dir=out_dir,
        problems=problems,
        prompts=prompts,
        schedule=schedule,
        tokenizer=tokenizer,
        updater=updater,
        sampler=engine_for(config, tokenizer, problems, parent) if in_process else None,
        queue=SampleQueue(config, out_dir, iterations) if config.asynchronous else None,
        vocab_size=policy.config.vocab_size,
        iterations=iterations,
        resumed_after=start,
        parent=parent,
        batches_drawn=batches_drawn,
        rollout_digests=checked_rollouts(out_dir, Path(parent)) if start and main else {},
    )


@dataclass
class Batch:
    """An iteration's scored rows and the informative groups the update trains on."""

    scored: list[dict[str, Any]] = field(default_factory=list)  # every row of every round
    groups: list[list[dict[str, Any]]] = field(default_factory=list)
    seen: list[list[dict[str, Any]]] = field(default_factory=list)  # every new group, kept or not
    dropped: int = 0  # groups uniform under the run's dynamic_sampling_metric
    rounds: int = 0
    engines: int = 0  # engines that sampled the last round
    queue: dict[str, float] = field(default_factory=dict)  # asynchronous: `queue/` metrics

    @property
    def trained(self) -> list[dict[str, Any]]:
        return [row for group in self.groups for row in group]

    def add(self, rows: list[dict[str, Any]], metric: GroupMetric | None) -> None:
        """One round's scored rows; with dynamic sampling (a ``metric``), only the groups that
        ``metric`` finds informative train."""
        self.scored += rows
        self.rounds += 1
        # A prompt drawn again in a later round (the schedule wraps) stays one group.
        taken = {group[0]["prompt_id"] for group in self.groups}
        sampled = [group for group in group_rows(rows) if group[0]["prompt_id"] not in taken]
        self.seen += sampled
        kept = sampled if metric is None else [g for g in sampled if is_informative(g, metric)]
        self.groups += kept
        self.dropped += len(sampled) - len(kept)

    def metrics(self, run: _Run) -> dict[str, float]:
        """The ``data/``, ``reward/`` and engine metrics of the iteration."""
        per_iteration = run.config.prompts_per_iteration
        return {
            **summarize(self.scored),
            Data.SAMPLING_ROUNDS: float(self.rounds),
            Data.GROUPS_SAMPLED: float(len({row["prompt_id"] for row in self.scored})),
            Data.GROUPS_TRAINED: float(len(self.groups)),
            Data.GROUPS_DROPPED: float(self.dropped),
            **uniform_groups(self.seen),
            Data.SCHEDULE_BATCHES: float(run.batches_drawn),
            Data.EPOCH: run.batches_drawn * per_iteration / len(run.problems),
            SamplerMetrics.ENGINES: float(self.engines),
            **self.queue,
        }


def fill_batch(run: _Run, iteration: int, phases: Phases) -> Batch:
    """Sample and score rounds of prompts until ``prompts_per_iteration`` informative groups
    are in (dynamic sampling; one round without it), for ``max_sampling_rounds`` at most. The
    rows that train are marked ``trained``, and the main process writes the iteration's
    rollouts. Asynchronous: the rounds come off the queue the sampler's process fills."""
    if run.queue is not None:
        return keep_rollouts(run, iteration, run.queue.batch(run, iteration, phases))
    config = run.config
    batch = Batch()
    while (
        batch.rounds < config.max_sampling_rounds
        and len(batch.groups) < config.prompts_per_iteration
    ):
        task_ids = next(run.schedule)
        run.batches_drawn += 1
        with phases(Time.SAMPLE):
            rows, batch.engines = _sample_on_ranks(
                run.sampler,
                [run.prompts[t] for t in task_ids],
                round_sampling(config, run.batches_drawn),
                iteration - 1,
                run.updater.accelerator,
                every_rank=config.samplers == "every_rank",
            )
        with phases(Time.SCORE):
            scored = _score_on_every_rank(
                rows, run.problems, config.scoring, run.updater.accelerator
            )
        batch.add(scored, config.dynamic_sampling_metric if config.dynamic_sampling else None)
        if not config.dynamic_sampling:
            break
    batch.groups = batch.groups[: config.prompts_per_iteration]
    return keep_rollouts(run, iteration, batch)


def keep_rollouts(run: _Run, iteration: int, batch: Batch) -> Batch:
    """Mark the rows that train ``trained``; the main process writes the iteration's
    rollouts."""
    for row in batch.scored:
        row["trained"] = False
    for row in batch.trained:
        row["trained"] = True
    if run.main:
        rollouts = run.out_dir / ROLLOUTS / f"iteration-{iteration:04d}.parquet"
        write_rows(batch.scored, rollouts, SCORED_COLUMNS)
        run.rollout_digests[f"{ROLLOUTS}/{rollouts.name}"] = sha256_file(rollouts)
    return batch


def round_sampling(config: RLConfig, batch_number: int) -> SamplingConfig:
    """The sampling of the run's ``batch_number``-th prompt batch: its own seed."""
    return config.sampling.model_copy(update={"seed": config.sampling.seed + batch_number})


def train(run: _Run, iteration: int, batch: Batch, phases: Phases) -> dict[str, float]:
    """The policy update on the batch's informative groups; without any, the weights stay."""
    from ..rl.batches import collate_rollouts

    with phases(Time.UPDATE):
        if batch.trained:
            pad = run.tokenizer.pad_token_id
            return run.updater.update(collate_rollouts(batch.trained, pad_token_id=pad))
    log.warning(
        "iteration %d: no informative group in %d sampling rounds: weights unchanged",
        iteration,
        batch.rounds,
    )
    return {Update.SKIPPED: 1.0}


def publish(run: _Run, iteration: int, metrics: dict[str, Any], phases: Phases) -> float | None:
    """Publish the iteration's checkpoint (with its trainer state and ``metrics``), refresh
    every engine from it and check each against the trainer's probe; then prune the old
    checkpoints (:func:`_retain`). Returns, on the main process, the worst engine's probe
    difference."""
    from accelerate.utils import gather_object

    config = run.config
    target = iteration_dir(run.out_dir, iteration)
    manifest = CheckpointManifest(
        stage=f"rl-{config.update.algorithm}",
        version=f"iteration-{iteration:04d}",
        parent=run.parent,
        config=config.model_dump(mode="json"),
        data={"problems": fingerprint(run.problems), **run.rollout_digests},
        metrics=metrics,
        steps=iteration,
    )
    run.parent = str(target)
    with phases(Time.SAVE):
        _publish(run.updater, run.tokenizer, target, manifest, iteration)
    with phases(Time.REFRESH):
        probe = run.updater.probe_logprobs(probe_ids(run.vocab_size))  # every rank: collective
        probe_diff: float | None
        if run.queue is not None:  # the sampler's process refreshes before its next round
            probe_diff = run.queue.published(iteration, target, probe)
        else:
            probe_diff = run.sampler.refresh(target, probe) if run.sampler is not None else None
        probe_diffs = gather_object([probe_diff])  # every engine's (one process: as is)
    if not run.main:
        return None
    _retain(config, run.out_dir, metrics)
    return max(d for d in probe_diffs if d is not None)


def record(run: _Run, metrics: dict[str, Any]) -> None:
    """The iteration's metrics: a row of ``metrics.jsonl``, the curves redrawn from the whole
    file, and a line in the log."""
    path = run.out_dir / METRICS_FILE
    atomic.append_line(path, json.dumps(metrics))
    log_stage_metrics(metrics, step=metrics[ITERATION])  # to the trackers of `report_to`
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    plot_curves(
        rows,
        run.out_dir / CURVES_FILE,
        x=ITERATION,
        panels={
            "reward and pass rate": [Reward.MEAN, Reward.PASS_RATE],
            "groups per update": [
                Data.GROUPS_SAMPLED,
                Data.GROUPS_TRAINED,
                Data.GROUPS_DROPPED,
                Data.GROUPS_UNIFORM_REWARD,
            ],
            "sampler vs trainer": [
                SamplerMetrics.LOGPROB_DIFF_MEAN,
                Update.KL_REF,
                Update.APPROX_KL,
            ],
            "seconds per phase": list(Time.PHASES),
        },
        title="RL iterations",
    )
    log.info(
        "iteration %d/%d: reward %.3f, pass rate %.3f, groups trained %d (dropped %d under "
        "%s, %d rounds; uniform in reward %d), sampler/trainer |dlogp| %.2g, %s",
        metrics[ITERATION],
        run.iterations,
        metrics[Reward.MEAN],
        metrics[Reward.PASS_RATE],
        metrics[Data.GROUPS_TRAINED],
        metrics[Data.GROUPS_DROPPED],
        run.config.dynamic_sampling_metric,
        metrics[Data.SAMPLING_ROUNDS],
        metrics[Data.GROUPS_UNIFORM_REWARD],
        metrics.get(SamplerMetrics.LOGPROB_DIFF_MEAN, float("nan")),
        ", ".join(f"{k} {metrics[k]:.1f}" for k in Time.PHASES if k in metrics),
    )


def _sample_on_ranks(
    sampler: Sampler | None,
    prompts: list[Prompt],
    sampling: SamplingConfig,
    policy_version: int,
    accelerator: Accelerator,
    every_rank: bool,
) -> tuple[list[dict[str, Any]], int]:
    """Every prompt's rows on every rank, in prompt order, and how many engines sampled them:
    the main process's engine samples them all, or (an engine on every rank) each rank samples
    a contiguous share. (On one process the collectives hand their input back.)"""
    from accelerate.utils import broadcast_object_list, gather_object

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
    from accelerate.utils import gather_object

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
    drawn = manifest.metrics.get(Data.SCHEDULE_BATCHES)
    return int(drawn) if drawn is not None else int(manifest.version.removeprefix("iteration-"))


def checked_rollouts(out_dir: Path, checkpoint: Path) -> dict[str, str]:
    """The rollouts files ``checkpoint``'s manifest records (older runs': none), each checked
    against its digest: a truncated or edited one is refused, naming it, before a resumed or
    extended run builds on it."""
    recorded = {
        name: sha for name, sha in read_manifest(checkpoint).data.items()
        if name.startswith(f"{ROLLOUTS}/")
    }  # fmt: skip
    for name, sha in recorded.items():
        path = out_dir / name
        if not path.is_file() or sha256_file(path) != sha:
            state = "missing" if not path.is_file() else "differs from its digest"
            raise StaleOutputError(
                f"{path}: {state} in {checkpoint / MANIFEST} (the rollouts RL sampled): it was "
                f"corrupted or edited. Delete {out_dir} to run RL again."
            )
    return recorded


def merge_rollouts(out_dir: Path) -> Path:
    """Every iteration's scored rollouts as one Parquet file (``rollouts.parquet``), e.g. to
    mine DPO pairs from what RL sampled; each checked against the digest the last checkpoint
    holds."""
    import pyarrow as pa

    last = last_published_iteration(Path(out_dir))
    if last:
        checked_rollouts(Path(out_dir), iteration_dir(Path(out_dir), last))
    files = sorted((Path(out_dir) / ROLLOUTS).glob("iteration-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{out_dir}/rollouts: no RL rollouts to merge")
    # Files of older runs lack the `trained` column: null there.
    tables = [read_table(f, SCORED_COLUMNS) for f in files]
    merged = pa.concat_tables(tables, promote_options="default")
    return write_table(merged, Path(out_dir) / "rollouts.parquet", SCORED_COLUMNS)


class UpdateStageConfig(Settings):
    """One policy update on scored rollouts: the RL loop's update as a stage of its own (when
    sampling and scoring run elsewhere, or to replay a rollouts file)."""

    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the policy that sampled the rollouts; an RL checkpoint continues its "
        "optimizer, KL controller and RNG state",
    )
    update: UpdateConfig = Field(default_factory=UpdateConfig)
    seed: Seed = 0


def run_update(config: UpdateStageConfig, scored: Path, out_dir: Path) -> Path:
    """One update of ``config.model`` on a scored rollouts Parquet file; the new checkpoint is
    published in ``out_dir`` (reused when it is already there for this config).

    Rank-aware under ``accelerate launch``: every rank reads every row, and the updater trains
    each rank on its share of every minibatch (rows ``rank::world``, DDP summing the gradients),
    so the weights do not depend on the number of ranks; the main process alone publishes."""
    import torch

    from ..rl.batches import collate_rollouts
    from ..rl.trainer_state import has_trainer_state, load_trainer_state

    stage = f"update-{config.update.algorithm}"
    out_dir = Path(out_dir)
    if already_published(out_dir, stage, config):
        return out_dir
    rows = read_rows(scored, (*TO_TRAIN, "excluded"))
    # The rows the loop trained on (dynamic sampling drops uniform groups); all, in older files.
    kept = [row for row in rows if not row["excluded"] and row.get("trained", True)]
    if not kept:
        excluded = sum(bool(row["excluded"]) for row in rows)
        raise ValueError(
            f"{scored}: no row to learn from: {excluded} excluded (sandbox errors), "
            f"{len(rows) - excluded} in groups dynamic sampling did not train"
        )
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
        steps=1,
    )
    _publish(updater, tokenizer, out_dir, manifest, version)
    log.info("update %s on %d rollouts: %s", stage, len(kept), out_dir)
    return out_dir


def _updater(update: UpdateConfig, model: ModelConfig, policy: PreTrainedModel) -> PolicyUpdater:
    """The updater of ``policy``: a critic when the algorithm trains one, and ``model`` as the
    frozen reference when the KL needs one (with LoRA the reference is the policy without its
    adapter)."""
    from ..rl.models import ValueModel
    from ..rl.policy_update import PolicyUpdater

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
    from ..rl.trainer_state import gather_policy_weights, gather_trainer_state

    weights = gather_policy_weights(updater)
    state = gather_trainer_state(updater, policy_version=policy_version)

    def write(folder: Path) -> None:
        write_model(folder, updater.policy, tokenizer, state_dict=weights)
        state.save(folder)

    if updater.accelerator.is_main_process:
        publish_folder(target, write, manifest)
    updater.accelerator.wait_for_everyone()


def _rl_stage(config: RLConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    from accelerate import PartialState

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
