"""The scoring stage: rollouts -> scored rollouts, every completion run against its tests in the
sandbox, all in flight at once.

Rewards (test + format + rule components, each kept as a ``reward_<name>`` column) come from
the verifier; learned terms (``learned``: a reward model's score) are added to them after it.
A ``sandbox_error`` is the infrastructure's failure (a program that breaks its containers gets
its own verdict): it is retried first, and one that persists is counted and named in the
metrics and scored as the verifier's ``RewardConfig.sandbox_errors`` says: by default marked
``excluded`` (reward NaN) and left out of its group and the update, so that an engine that
fails mid-batch trains nothing as a failure; ``"fail"`` scores it 0. A batch with more of them
than ``max_sandbox_error_share`` stops the run: the sandbox is failing.
"""

from __future__ import annotations

import atexit
import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ...sandbox import DEFAULT_IMAGE, Limits, PoolConfig, SandboxPool, connect_hosts
from ...sandbox.runner import source_version
from ...settings.config import Settings
from ...settings.walk import OutsideInput
from ...verifiers import CompletionStyle, Problem, RewardConfig, Verdict, VerdictStatus, Verifier
from ...verifiers.environments import environments
from ...verifiers.rewards import term_names
from ..data.problem_sets import ProblemSet, load_problem_set
from ..data.rows import (
    REWARD_COMPONENT_PREFIX,
    SCORE_COLUMNS,
    SCORE_OUTPUT,
    TO_SCORE,
    read_table,
    write_rows,
    write_table,
)
from ..inference.episodes import EpisodeConfig, EpisodeSampler
from ..inference.sampling import Sampler
from ..progress import track
from ..resources import on_close
from ..reward_models import LearnedReward, add_learned_rewards
from ..rl.metric_names import Data, Reward, reward_component, status_count


class SandboxSettings(BaseModel, OutsideInput):
    """Where programs run: the Docker engines (the pool spreads its containers over all of
    them, so several machines score one run), the image, and what each container may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    docker_hosts: list[str] = Field(
        default_factory=list,
        description="DOCKER_HOST-style URLs (unix://, tcp://, ssh://), each with the sandbox "
        "image; empty: this machine's engine (DOCKER_HOST or the default socket)",
    )
    image: str = Field(DEFAULT_IMAGE, min_length=1, description="the sandbox image")
    cpus: float = Field(1.0, gt=0, le=64, description="CPUs per container")
    container_memory_mb: int = Field(
        2048, ge=256, le=262_144, description="per container: runner, program, judge, tmpfs"
    )

    def pool_config(self, size: int) -> PoolConfig:
        return PoolConfig(
            size=size,
            image=self.image,
            docker_hosts=tuple(self.docker_hosts),
            cpus=self.cpus,
            container_memory_mb=self.container_memory_mb,
        )

    def content_digests(self) -> dict[str, str]:
        """The image's id on each engine (an image rebuilt under the same name is another
        input) and the source version of the runner it must hold. An engine that cannot be
        reached, or lacks the image, is :class:`SandboxUnavailable` naming it: the stage that
        runs programs would fail there anyway."""
        clients = connect_hosts(self.pool_config(size=1))
        try:
            ids = [str(client.images.get(self.image).id) for client in clients]
        finally:
            for client in clients:
                client.close()
        hosts = [f" on {host}" for host in self.docker_hosts] or [""]
        named = (f"sandbox image {self.image}{host}" for host in hosts)
        return {**dict(zip(named, ids, strict=True)), "sandbox runner": source_version()}


class ScoreConfig(Settings):
    """How completions are run and rewarded."""

    reward: RewardConfig = Field(default_factory=RewardConfig)
    workers: int = Field(4, ge=1, le=256, description="sandbox containers (executions in flight)")
    timeout_s: float = Field(10.0, gt=0, le=600, description="per program (call) or io case")
    compile_timeout_s: float = Field(
        10.0, gt=0, le=600, description="a compiled language's compile (C++), once per program"
    )
    memory_mb: int = Field(512, ge=64, le=16384, description="address space per program")
    sandbox_retries: int = Field(2, ge=0, le=10, description="re-runs of a sandbox_error")
    max_sandbox_error_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="a batch whose share of samples still sandbox_error after the retries is "
        "above this stops with an error: the sandbox is failing, not the programs",
    )
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    learned: dict[str, LearnedReward] = Field(
        default_factory=dict,
        description="learned reward terms, name -> a reward model: its score of each "
        "completion is the column reward_<name>, and reward gains weight x score",
    )

    @field_validator("learned")
    @classmethod
    def _own_names(
        cls, learned: dict[str, LearnedReward], info: ValidationInfo
    ) -> dict[str, LearnedReward]:
        reward = info.data.get("reward")
        taken = sorted(set(learned) & set(term_names() if reward is None else reward.names()))
        if taken:
            raise ValueError(f"learned reward {taken}: the verifier's term of that name has it")
        return learned

    @model_validator(mode="after")
    def _room_for_the_program(self) -> ScoreConfig:
        if self.sandbox.container_memory_mb < self.memory_mb + 256:
            raise ValueError(
                f"sandbox.container_memory_mb={self.sandbox.container_memory_mb} leaves no room "
                f"for a program of memory_mb={self.memory_mb} next to the runner and judge: "
                f"give the container at least {self.memory_mb + 256}"
            )
        return self

    def limits(self) -> Limits:
        return Limits(
            wall_time_s=self.timeout_s,
            cpu_time_s=self.timeout_s,
            memory_mb=self.memory_mb,
            compile_time_s=self.compile_timeout_s,
        )


_POOLS: dict[PoolConfig, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(config: PoolConfig) -> SandboxPool:
    """The process-wide warm sandbox pool for ``config`` (started once)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(config)
        if pool is None:
            pool = SandboxPool(config)
            pool.start()  # SandboxUnavailable names the Docker host now, not per sample
            if not _POOLS:
                atexit.register(close_pools)  # containers outlive a process that forgets them
            _POOLS[config] = pool
        return pool


def with_episodes(
    sampler: Sampler,
    tokenizer: Any,
    problems: Mapping[str, Problem],
    episodes: EpisodeConfig,
    config: ScoreConfig,
) -> Sampler:
    """``sampler``, or, for episodes of more than one turn, one whose rows are episodes in
    their environment, which runs the answers on this process's warm pool under the scoring's
    limits."""
    if episodes.max_turns == 1:
        return sampler
    environment = environments()[episodes.environment](
        get_pool(config.sandbox.pool_config(config.workers)),
        limits=config.limits(),
        reward_config=config.reward,
        completion_style="chat",  # episodes are chat: the environment replies in a user turn
    )
    return EpisodeSampler(sampler, tokenizer, problems, environment, episodes)


def check_sandbox(settings: SandboxSettings | None = None) -> None:
    """Raise :class:`SandboxUnavailable` now if scoring could not run (a Docker engine not
    reachable, or without the sandbox image), rather than after the samples it would score
    were generated."""
    for client in connect_hosts((settings or SandboxSettings()).pool_config(size=1)):
        client.close()


@on_close
def close_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


class SandboxFailing(RuntimeError):
    """Too many of a batch's samples ended in sandbox errors to train or report on it."""


def _scores(verdict: Verdict) -> dict[str, Any]:
    excluded = verdict.reward is None  # only a sandbox error, with sandbox_errors="exclude"
    scores = {
        "reward": math.nan if excluded else verdict.reward,
        "passed": verdict.passed,
        "status": verdict.status.value,
        "pass_fraction": verdict.pass_fraction,
        "excluded": excluded,
    }
    for name, value in verdict.reward_components.items():
        scores[f"{REWARD_COMPONENT_PREFIX}{name}"] = math.nan if value is None else value
    return scores


def score_rollouts(
    rows: Sequence[Mapping[str, Any]],
    problems: Mapping[str, Problem],
    config: ScoreConfig,
    *,
    executor: Any | None = None,
    description: str = "scoring",
) -> list[dict[str, Any]]:
    """``rows`` with their scores added, in order, shown as a task (``description``)."""
    executor = executor or get_pool(config.sandbox.pool_config(config.workers))
    scored: list[dict[str, Any] | None] = [None] * len(rows)
    pending = list(range(len(rows)))
    # An episode the sandbox cut short (its public tests' run failed): what the model would
    # have done with the feedback is unknown, so it is left out as a sandbox error is.
    cut_out = config.reward.sandbox_errors == "exclude"
    with track(description, len(rows)) as task:
        for attempt in range(config.sandbox_retries + 1):
            by_style: dict[CompletionStyle, list[int]] = {}
            for index in pending:
                by_style.setdefault(rows[index].get("completion_style", "auto"), []).append(index)
            retry = []
            for style, indices in by_style.items():
                verifier = Verifier(
                    executor,
                    limits=config.limits(),
                    reward_config=config.reward,
                    completion_style=style,
                )
                samples = [
                    {
                        "task_id": rows[i]["prompt_id"],
                        "completion": rows[i]["completion"],
                        "completion_ids": rows[i].get("completion_ids"),
                    }
                    for i in indices
                ]
                for position, verdict in verifier.iter_verify(problems, samples):
                    index = indices[position]
                    scores = _scores(verdict)
                    if rows[index].get("episode_end") == "sandbox_error" and cut_out:
                        scores.update(reward=math.nan, excluded=True)
                    scored[index] = {**rows[index], **scores}
                    last_try = attempt == config.sandbox_retries
                    if verdict.status is VerdictStatus.SANDBOX_ERROR and not last_try:
                        retry.append(index)
                    else:
                        task.advance()
            pending = retry
            if not pending:
                break
    done = [row for row in scored if row is not None]
    errors = sum(row["status"] == VerdictStatus.SANDBOX_ERROR.value for row in done)
    if errors > config.max_sandbox_error_share * len(done):
        raise SandboxFailing(
            f"{description}: {errors} of {len(done)} samples still ended in sandbox errors after "
            f"{config.sandbox_retries} retries, over max_sandbox_error_share "
            f"{config.max_sandbox_error_share}: the sandbox is failing (is the Docker engine "
            f"up? the log names each error); this batch is not kept"
        )
    return add_learned_rewards(done, config.learned)


def score_turns(
    rows: Sequence[Mapping[str, Any]],
    problems: Mapping[str, Problem],
    config: ScoreConfig,
    turns: int,
    *,
    executor: Any | None = None,
    description: str = "scoring",
) -> list[list[dict[str, Any]]]:
    """Episodes scored turn by turn: for each turn t up to ``turns``, ``rows`` (scored on their
    final answers) with the scores of the answer each held after turn t (its final one, once
    it ended). Each distinct answer is run once."""

    def answer(row: Mapping[str, Any], turn: int) -> str:
        answers = row.get("answers") or [row["completion"]]
        return answers[min(turn, len(answers)) - 1]

    earlier = {
        (row["prompt_id"], row["completion_style"], answer(row, turn))
        for row in rows
        for turn in range(1, turns)
    } - {(row["prompt_id"], row["completion_style"], row["completion"]) for row in rows}
    unique = [
        {"prompt_id": task, "completion_style": style, "completion": text}
        for task, style, text in sorted(earlier)
    ]
    scored = score_rollouts(
        unique, problems, config, executor=executor, description=f"{description}, earlier turns"
    )
    scores = {
        (row["prompt_id"], row["completion_style"], row["completion"]): row
        for row in [*scored, *rows]
    }
    columns = (
        [key for key in rows[0] if key in SCORE_COLUMNS or key.startswith(REWARD_COMPONENT_PREFIX)]
        if rows
        else []
    )
    return [
        [
            {
                **row,
                **{
                    key: scores[(row["prompt_id"], row["completion_style"], answer(row, turn))][key]
                    for key in columns
                },
            }
            for row in rows
        ]
        for turn in range(1, turns + 1)
    ]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Reward mean, pass rate, components and status counts of scored rows (the ``data/`` and
    ``reward/`` metrics). Sandbox errors are counted and named; the means are over the rows
    kept (an excluded sandbox error is no failure of the program's)."""
    kept = [row for row in rows if not row["excluded"]]
    statuses = Counter(row["status"] for row in rows)
    summary: dict[str, float] = {
        Data.SAMPLES: float(len(rows)),
        Data.SANDBOX_ERRORS: float(statuses.get(VerdictStatus.SANDBOX_ERROR.value, 0)),
        Reward.MEAN: _mean([row["reward"] for row in kept]),
        Reward.PASS_RATE: _mean([float(row["passed"]) for row in kept]),
    }
    components = {key for row in kept for key in row if key.startswith(REWARD_COMPONENT_PREFIX)}
    for column in sorted(components):
        name = column.removeprefix(REWARD_COMPONENT_PREFIX)
        summary[reward_component(name)] = _mean([row[column] for row in kept])
    summary.update({status_count(status): float(n) for status, n in statuses.items()})
    if any(row.get("model_mask") is not None for row in rows):  # episodes
        masks = [row.get("model_mask") or [1] * len(row["completion_ids"]) for row in rows]
        tokens = sum(len(mask) for mask in masks)
        summary[Data.TURNS_MEAN] = _mean([float(row.get("turns", 1)) for row in rows])
        summary[Data.EPISODES_PASSED_PUBLIC] = float(
            sum(row.get("episode_end") == "passed" for row in rows)
        )
        summary[Data.ENVIRONMENT_TOKEN_SHARE] = (
            sum(mask.count(0) for mask in masks) / tokens if tokens else math.nan
        )
    return summary


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def scored_path(out_dir: Path) -> Path:
    return Path(out_dir) / "scored.parquet"


def shard_count(rollouts: Path, wanted: int) -> int:
    """How many shards ``rollouts`` is cut into: ``wanted``, but none of them empty."""
    import pyarrow.parquet as pq

    rows = pq.read_metadata(str(rollouts)).num_rows
    if rows == 0:
        raise ValueError(f"{rollouts}: no rollouts to score")
    return max(1, min(wanted, rows))


def score_shard(
    config: ScoreConfig,
    rollouts: Path,
    problem_set: ProblemSet,
    out_dir: Path,
    shard: int = 0,
    num_shards: int = 1,
) -> Path:
    """Score the ``shard``-th of ``num_shards`` contiguous slices of a rollouts Parquet file
    (reused when already scored): the unit a task runner fans out."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not one of {num_shards} shards")
    target = Path(out_dir) / "shards" / f"scored-{shard:04d}-of-{num_shards:04d}.parquet"
    if target.is_file():
        return target
    table = read_table(rollouts, TO_SCORE)
    start, stop = (len(table) * shard) // num_shards, (len(table) * (shard + 1)) // num_shards
    rows = table.slice(start, stop - start).to_pylist()
    problems = load_problem_set(problem_set)
    label = "scoring" if num_shards == 1 else f"scoring shard {shard + 1}/{num_shards}"
    scored = score_rollouts(rows, problems, config, description=label)
    return write_rows(scored, target, SCORE_OUTPUT)


def merge_shards(shards: Sequence[Path], out_dir: Path) -> Path:
    """``scored.parquet``: the scored shards, in order, as one file."""
    import pyarrow as pa

    tables = [read_table(shard, SCORE_OUTPUT) for shard in shards]
    return write_table(
        pa.concat_tables(tables, promote_options="default"), scored_path(out_dir), SCORE_OUTPUT
    )


def run_score(config: ScoreConfig, rollouts: Path, problem_set: ProblemSet, out_dir: Path) -> Path:
    """Score a rollouts Parquet file in this process; writes ``scored.parquet`` (reused when
    already there) and returns its path."""
    target = scored_path(out_dir)
    if target.is_file():
        return target
    return merge_shards([score_shard(config, rollouts, problem_set, out_dir)], out_dir)
