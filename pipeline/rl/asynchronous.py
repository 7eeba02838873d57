"""The asynchronous RL loop (``rl.asynchronous``): the sampler runs in a process of its own and
keeps sampling and scoring rounds of prompts while the trainer updates, at most
``max_staleness`` policy versions behind the trainer.

The queue between them is a folder of the run, ``queue/``: each round the sampler samples and
scores is a rows file and a header written after it (the marker that the round is whole), so
that the queue's state survives a kill -9 of either side and a resumed run finds it. A round is
one prompt batch of the run's schedule, sampled by one policy version; its groups whose
``dynamic_sampling_metric`` is uniform are dropped before they enter the queue (their rows
stay in the round for the rollouts files), and every other group is one queue item. An episode
of several turns is one row of its group: it enters the queue whole.

Which groups an iteration trains on is decided by a :class:`Ledger`, a deterministic function
of the rounds' headers that the trainer and the sampler both run: the trainer to take its
batch, the sampler to know which iteration its next round is for, and so whether the weights
it serves are new enough (a version ``v`` samples rounds for iterations up to ``v + 1 + K``).
The queue is bounded by that rule: at most ``K + 1`` iterations of rounds ahead of the
trainer. An iteration takes queued groups first in, first out: one sampled more than ``K``
versions before the trainer's weights is dropped and counted (``queue/rows_stale``), never
trained on; so is a group whose prompt the iteration already took (as the synchronous loop
does). It opens new rounds until it holds ``prompts_per_iteration`` groups or has opened
``max_sampling_rounds``; groups left over wait for the next iteration, unless they would be too
stale for it. At ``max_staleness: 0`` this is the synchronous loop, row for row: the sampler
samples a round only with the weights of the iteration before, and leftovers are dropped.

The sampler's process is watched by a thread of the trainer: killed, it is restarted (up to
``sampler_restarts`` times) and continues from the queue's state; a round it was sampling is
sampled again with the same seed. Its log is ``queue/sampler.log``; it writes its pid to
``queue/sampler.pid``. After each publish the trainer writes ``queue/published.json`` (the
checkpoint and the trainer's probe logprobs); the sampler refreshes its engine from it before
its next round and checks the probe, as the synchronous loop does.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from .. import atomic
from ..checkpoints.manifest import read_manifest
from .metric_names import Data, Queue, Time, staleness_count

if TYPE_CHECKING:  # the stage imports this module for its config: theirs load when it runs
    from ..stages.rl import Batch, Phases, RLConfig, _Run

log = logging.getLogger(__name__)

QUEUE = "queue"  # the folder, in the run's out_dir
NOTICE = "published.json"  # the newest checkpoint and the trainer's probe
PID = "sampler.pid"
LOG = "sampler.log"
ERROR = "sampler-error.txt"  # why the sampler's process failed (a kill leaves none)
LOCK = "sampler.lock"  # one sampler per run folder, even while a killed trainer's ends
POLL_S = 0.05  # how often a waiting side looks at the queue's folder
STOP_S = 30.0  # how long the sampler's process is given to end before it is killed


class AsyncConfig(BaseModel):
    """The asynchronous loop: how stale a trained row may be, and the sampler's process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_staleness: int = Field(
        1,
        ge=0,
        le=64,
        description="policy versions a trained row may lag the trainer's weights (K); rows "
        "older are dropped and counted. 0: the synchronous loop's rows and weights, with the "
        "sampler in a process of its own; K > 0 needs update.sampler_is_cap or the decoupled "
        "loss",
    )
    sampler_restarts: int = Field(
        2,
        ge=0,
        le=100,
        description="restarts of a killed sampler process before the run ends with an error "
        "(a run started again resumes)",
    )
    sampler_cpus: list[int] | None = Field(
        None,
        min_length=1,
        description="cores the sampler's process runs on, one thread each (e.g. [1], with the "
        "trainer started under `taskset -c 0`); null: the trainer's cores and thread count",
    )


class SamplerFailed(RuntimeError):
    """The sampler's process failed, or was killed more often than it may be restarted."""


class RoundHeader(BaseModel):
    """A round's record, written after its rows: what the ledger reads, and the sampler's
    seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int  # the schedule's prompt batch (1-based), which also seeds its sampling
    policy_version: int  # the weights that sampled it (the iteration that published them)
    first_group: int  # the stream index of its first queued group
    queued: tuple[str, ...]  # the prompt ids of its groups that entered the queue, in order
    sample_s: float = 0.0
    score_s: float = 0.0
    idle_s: float = 0.0  # the sampler waiting for weights new enough before this round
    refresh_probe_diff: float | None = None  # of a refresh just before it

    @property
    def end(self) -> int:
        """The stream index after its last queued group."""
        return self.first_group + len(self.queued)

    def groups(self) -> list[QueuedGroup]:
        return [QueuedGroup(self.number, prompt, self.policy_version) for prompt in self.queued]


@dataclass(frozen=True)
class QueuedGroup:
    round: int
    prompt_id: str
    policy_version: int


@dataclass
class Decision:
    """What an iteration decided: the rounds it opened, the groups it took, those it dropped
    (too stale, or a prompt it already held), and the ledger's counters after it."""

    iteration: int
    opened: list[int] = field(default_factory=list)
    taken: list[QueuedGroup] = field(default_factory=list)
    stale: list[QueuedGroup] = field(default_factory=list)
    repeated: list[QueuedGroup] = field(default_factory=list)
    rounds_opened: int = 0
    dequeued: int = 0

    @property
    def dropped(self) -> list[QueuedGroup]:
        return self.stale + self.repeated


class Ledger:
    """Which queued groups each iteration trains on, from the rounds' headers alone."""

    def __init__(
        self,
        per_iteration: int,
        max_rounds: int,
        max_staleness: int,
        *,
        iteration: int = 1,
        rounds_opened: int = 0,
        dequeued: int = 0,
        pending: Iterable[QueuedGroup] = (),
    ) -> None:
        self.per_iteration = per_iteration
        self.max_rounds = max_rounds
        self.max_staleness = max_staleness
        self.rounds_opened = rounds_opened  # rounds taken into the ledger, over the run
        self.dequeued = dequeued  # groups taken off the queue (trained or dropped), over the run
        self.pending = deque(pending)  # queued, not yet dequeued: first in, first out
        self.decision = Decision(iteration)

    @property
    def iteration(self) -> int:
        return self.decision.iteration

    @property
    def queued(self) -> int:
        """The stream index the next queued group gets."""
        return self.dequeued + len(self.pending)

    def needs_round(self) -> bool:
        """Whether the iteration opens another round: short of groups, with rounds left."""
        self._take()
        decision = self.decision
        return len(decision.taken) < self.per_iteration and len(decision.opened) < self.max_rounds

    def next_opening(self) -> int:
        """The iteration that opens the next round (closing those that need none)."""
        while not self.needs_round():
            self.close()
        return self.iteration

    def open(self, header: RoundHeader) -> None:
        if header.number != self.rounds_opened + 1 or header.first_group != self.queued:
            raise ValueError(
                f"round {header.number} starting at group {header.first_group}: the queue "
                f"expected round {self.rounds_opened + 1} starting at group {self.queued}"
            )
        self.rounds_opened += 1
        self.decision.opened.append(header.number)
        self.pending.extend(header.groups())
        self._take()

    def close(self) -> Decision:
        """End the iteration: the groups left that the next one could not train on (more than
        ``max_staleness`` versions behind its weights) are dropped now."""
        self._take()
        decision = self.decision
        oldest_next = decision.iteration - self.max_staleness
        while self.pending and self.pending[0].policy_version < oldest_next:  # versions rise
            decision.stale.append(self.pending.popleft())
            self.dequeued += 1
        decision.rounds_opened, decision.dequeued = self.rounds_opened, self.dequeued
        self.decision = Decision(decision.iteration + 1)
        return decision

    def _take(self) -> None:
        decision = self.decision
        oldest = decision.iteration - 1 - self.max_staleness  # the trainer's version minus K
        held = {group.prompt_id for group in decision.taken}
        while self.pending and len(decision.taken) < self.per_iteration:
            group = self.pending.popleft()
            self.dequeued += 1
            if group.policy_version < oldest:
                decision.stale.append(group)
            elif group.prompt_id in held:
                decision.repeated.append(group)
            else:
                decision.taken.append(group)
                held.add(group.prompt_id)


# --------------------------------------------------------------------------------------------
# The queue's folder
# --------------------------------------------------------------------------------------------


def _header_path(folder: Path, number: int) -> Path:
    return folder / f"round-{number:06d}.json"


def _rows_path(folder: Path, number: int) -> Path:
    return folder / f"round-{number:06d}.rows.json"


def write_round(folder: Path, header: RoundHeader, rows: list[dict[str, Any]]) -> None:
    """The rows, then the header: a round is in the queue once its header is."""
    atomic.write_text(_rows_path(folder, header.number), json.dumps(rows))
    atomic.write_text(_header_path(folder, header.number), header.model_dump_json())


def read_headers(folder: Path) -> dict[int, RoundHeader]:
    return {
        header.number: header
        for header in (
            RoundHeader.model_validate_json(path.read_text())
            for path in folder.glob("round-[0-9][0-9][0-9][0-9][0-9][0-9].json")
        )
    }


def _delete_round(folder: Path, number: int) -> None:
    _header_path(folder, number).unlink(missing_ok=True)  # the marker first
    _rows_path(folder, number).unlink(missing_ok=True)


@dataclass
class Round:
    header: RoundHeader
    rows: list[dict[str, Any]]

    @classmethod
    def read(cls, folder: Path, header: RoundHeader) -> Round:
        return cls(header, json.loads(_rows_path(folder, header.number).read_text()))

    def group(self, prompt_id: str) -> list[dict[str, Any]]:
        """A queued group's rows (a group leaves out its excluded rows, as ``group_rows``)."""
        return [r for r in self.rows if r["prompt_id"] == prompt_id and not r["excluded"]]

    def queues(self, row: dict[str, Any]) -> bool:
        """Whether ``row`` belongs to a queued group (else the round's opening decides it)."""
        return row["prompt_id"] in self.header.queued and not row["excluded"]


def resumed_ledger(out_dir: Path, config: RLConfig) -> tuple[Ledger, list[RoundHeader]]:
    """The ledger at the start of the iteration after the newest published one (its counters
    are in that checkpoint's metrics; its pending groups in the queue's rounds), and the rounds
    sampled since, in order. A round the ledger needs that is missing is named."""
    from ..stages.rl import iteration_dir, last_published_iteration

    assert config.asynchronous is not None
    folder = out_dir / QUEUE
    while True:  # the trainer deletes decided rounds after each publish: read a settled state
        last = last_published_iteration(out_dir)
        metrics = read_manifest(iteration_dir(out_dir, last)).metrics if last else {}
        headers = read_headers(folder) if folder.is_dir() else {}
        if last_published_iteration(out_dir) == last:
            break
    rounds_opened = int(metrics.get(Data.SCHEDULE_BATCHES, last))  # older runs: one a version
    dequeued = int(metrics.get(Queue.GROUPS_DEQUEUED, 0))
    unopened = [headers[n] for n in sorted(headers) if n > rounds_opened]
    opened = [headers[n] for n in sorted(headers) if n <= rounds_opened]
    pending = [
        group
        for header in opened
        for index, group in enumerate(header.groups(), header.first_group)
        if index >= dequeued
    ]
    if unopened:
        end = unopened[0].first_group
    elif rounds_opened in headers:
        end = headers[rounds_opened].end
    else:
        end = dequeued  # every round opened is decided
    numbers = [header.number for header in unopened]
    if len(pending) != end - dequeued or numbers != list(
        range(rounds_opened + 1, len(numbers) + rounds_opened + 1)
    ):
        raise FileNotFoundError(
            f"{folder}: rounds are missing (the newest checkpoint, iteration {last}, has taken "
            f"{rounds_opened} rounds and {dequeued} groups; the folder holds rounds "
            f"{sorted(headers)}): delete {folder} and the iterations after the last one whose "
            "rounds are all there to resume"
        )
    settings = config.asynchronous
    ledger = Ledger(
        config.prompts_per_iteration,
        config.max_sampling_rounds,
        settings.max_staleness,
        iteration=last + 1,
        rounds_opened=rounds_opened,
        dequeued=dequeued,
        pending=pending,
    )
    return ledger, unopened


# --------------------------------------------------------------------------------------------
# The trainer's side
# --------------------------------------------------------------------------------------------


class SampleQueue:
    """The trainer's side of the queue: it starts the sampler's process (a context manager),
    restarts it when it is killed, and takes each iteration's batch off the queue."""

    def __init__(self, config: RLConfig, out_dir: Path, iterations: int) -> None:
        assert config.asynchronous is not None
        self.config, self.settings, self.iterations = config, config.asynchronous, iterations
        self.out_dir, self.folder = out_dir, out_dir / QUEUE
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ledger, _ = resumed_ledger(out_dir, config)
        self.rounds = {
            number: Round.read(self.folder, header)
            for number, header in read_headers(self.folder).items()
            if number <= self.ledger.rounds_opened and header.end > self.ledger.dequeued
        }
        self.last: Decision | None = None  # the iteration about to be published
        self.probe_diff = math.nan
        self.restarts = 0
        self.lock = threading.Lock()
        self.closing = self.finished = False
        self.failure: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.watcher: threading.Thread | None = None

    # -- the sampler's process ---------------------------------------------------------------

    def __enter__(self) -> SampleQueue:
        if self.ledger.iteration > self.iterations:  # a finished run, started again
            return self
        self.process = self._spawn()
        self.watcher = threading.Thread(target=self._watch, name="sampler-watch", daemon=True)
        self.watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.closing = True
            process = self.process
        if process is not None and process.poll() is None:
            process.terminate()  # its handler closes the engine and the sandbox pool
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.watcher is not None:
            self.watcher.join()

    def _spawn(self) -> subprocess.Popen[bytes]:
        import torch

        (self.folder / ERROR).unlink(missing_ok=True)
        command = [sys.executable, "-c", f"from {__name__} import main; main()"]
        command += [str(self.out_dir), "--parent", str(os.getpid())]
        command += ["--threads", str(torch.get_num_threads())]
        with (self.folder / LOG).open("ab") as output:
            # its own session: a Ctrl-C in the terminal reaches the trainer, which stops it
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _watch(self) -> None:
        """Wait on the sampler's process; restart it when it is killed, or say why not."""
        while True:
            assert self.process is not None
            pid, code = self.process.pid, self.process.wait()
            with self.lock:
                if self.closing:
                    return
                if code == 0:
                    self.finished = True
                    return
                error = self.folder / ERROR
                if error.is_file():
                    self.failure = (
                        f"failed: {error.read_text().strip()} (its log: {self.folder / LOG})"
                    )
                    return
                how = f"killed by signal {-code}" if code < 0 else f"ended with exit code {code}"
                if self.restarts >= self.settings.sampler_restarts:
                    self.failure = (
                        f"(pid {pid}) was {how} after {self.restarts} restarts "
                        f"(asynchronous.sampler_restarts={self.settings.sampler_restarts})"
                    )
                    return
                self.restarts += 1
                log.warning(
                    "the sampler's process (pid %d) was %s: restarting it (%d of %d)",
                    pid,
                    how,
                    self.restarts,
                    self.settings.sampler_restarts,
                )
                self.process = self._spawn()

    def _raise_failure(self) -> None:
        from ..stages.rl import last_published_iteration

        if self.failure is not None:
            last = last_published_iteration(self.out_dir)
            raise SamplerFailed(
                f"the sampler's process {self.failure}; iterations up to {last} are published: "
                f"run the same command again to resume after iteration {last}"
            )

    def _wait_for(self, number: int) -> Round:
        """Round ``number``, once the sampler has written it."""
        path = _header_path(self.folder, number)
        while not path.is_file():
            self._raise_failure()
            if self.finished and not path.is_file():
                raise SamplerFailed(
                    f"the sampler's process ended without sampling round {number} "
                    f"({self.folder / LOG})"
                )
            time.sleep(POLL_S)
        return Round.read(self.folder, RoundHeader.model_validate_json(path.read_text()))

    # -- the trainer's iteration -------------------------------------------------------------

    def batch(self, run: _Run, iteration: int, phases: Phases) -> Batch:
        """The iteration's groups off the queue, waiting for the rounds it opens; its rows are
        those it decided, in the rounds' order."""
        from ..stages.rl import Batch

        ledger = self.ledger
        assert ledger.iteration == iteration, (ledger.iteration, iteration)
        while ledger.needs_round():
            with phases(Time.TRAINER_IDLE):
                opened = self._wait_for(ledger.rounds_opened + 1)
            self.rounds[opened.header.number] = opened
            ledger.open(opened.header)
        decision = self.last = ledger.close()
        headers = [self.rounds[number].header for number in decision.opened]
        phases.seconds[Time.SAMPLE] = sum(header.sample_s for header in headers)
        phases.seconds[Time.SCORE] = sum(header.score_s for header in headers)
        phases.seconds[Time.SAMPLER_IDLE] = sum(header.idle_s for header in headers)
        diffs = [h.refresh_probe_diff for h in headers if h.refresh_probe_diff is not None]
        self.probe_diff = max(diffs, default=math.nan)
        run.batches_drawn = decision.rounds_opened
        groups = [self._rows(group) for group in decision.taken]
        seen, uniform = self._seen(decision)
        batch = Batch(
            scored=self._decided_rows(decision),
            groups=groups,
            seen=seen,
            dropped=uniform,
            rounds=len(decision.opened),
            engines=1,
            queue=self._metrics(decision, iteration, groups),
        )
        for number in [n for n, r in self.rounds.items() if r.header.end <= decision.dequeued]:
            del self.rounds[number]  # every group of it is decided
        return batch

    def _rows(self, group: QueuedGroup) -> list[dict[str, Any]]:
        return self.rounds[group.round].group(group.prompt_id)

    def _decided_rows(self, decision: Decision) -> list[dict[str, Any]]:
        """Every row the iteration decided, in the rounds' order: those of the rounds it opened
        that no queued group holds, and those of the queued groups it took or dropped."""
        groups = {(group.round, group.prompt_id) for group in decision.taken + decision.dropped}
        numbers = sorted({*decision.opened, *(number for number, _ in groups)})
        return [
            row
            for number in numbers
            for row in self.rounds[number].rows
            if (
                (number, row["prompt_id"]) in groups
                if self.rounds[number].queues(row)
                else number in decision.opened
            )
        ]

    def _seen(self, decision: Decision) -> tuple[list[list[dict[str, Any]]], int]:
        """The groups of the rounds the iteration opened, but those whose prompt it already
        held when the round opened (as the synchronous loop counts them), and how many of them
        were uniform (not queued)."""
        from ..stages.rl import group_rows

        seen, uniform = [], 0
        for number in decision.opened:
            held = {group.prompt_id for group in decision.taken if group.round < number}
            for group in group_rows(self.rounds[number].rows):
                if group[0]["prompt_id"] not in held:
                    seen.append(group)
                    uniform += group[0]["prompt_id"] not in self.rounds[number].header.queued
        return seen, uniform

    def _metrics(
        self, decision: Decision, iteration: int, groups: list[list[dict[str, Any]]]
    ) -> dict[str, float]:
        """The ``queue/`` metrics: the trained rows by staleness (every value from 0 to K, and
        any other there is), the rows dropped as too stale, the counters."""
        staleness = Counter(iteration - 1 - row["policy_version"] for g in groups for row in g)
        waiting = [n for n in read_headers(self.folder) if n > decision.rounds_opened]
        return {
            **{
                staleness_count(k): float(staleness[k])
                for k in sorted({*range(self.settings.max_staleness + 1), *staleness})
            },
            Queue.ROWS_STALE: float(sum(len(self._rows(group)) for group in decision.stale)),
            Queue.GROUPS_DEQUEUED: float(decision.dequeued),
            Queue.ROUNDS_WAITING: float(len(waiting)),
            Queue.SAMPLER_RESTARTS: float(self.restarts),
        }

    def published(self, iteration: int, checkpoint: Path, probe: list[float]) -> float:
        """Tell the sampler about the new checkpoint (it refreshes before its next round and
        checks the probe), and delete the rounds every group of which is decided by a
        published iteration. Returns the worst probe difference of the refreshes before the
        rounds this iteration opened (NaN: none)."""
        atomic.write_json(
            self.folder / NOTICE,
            {"iteration": iteration, "checkpoint": str(checkpoint), "probe": probe},
        )
        decided = self.last
        assert decided is not None and decided.iteration == iteration
        for number, header in read_headers(self.folder).items():
            if number <= decided.rounds_opened and header.end <= decided.dequeued:
                _delete_round(self.folder, number)
        return self.probe_diff


# --------------------------------------------------------------------------------------------
# The sampler's process
# --------------------------------------------------------------------------------------------


class _Sampler:
    """The sampler's process: its engine, the policy version it serves, the schedule."""

    def __init__(self, config: RLConfig, out_dir: Path, parent: int) -> None:
        from ..stages import rl as stage

        self.config, self.out_dir, self.parent = config, out_dir, parent
        self.folder = out_dir / QUEUE
        self.problems, tokenizer, self.prompts = stage.problems_and_prompts(config)
        self.ledger, unopened = resumed_ledger(out_dir, config)
        for header in unopened:  # sampled before a restart: the ledger goes on after them
            self.ledger.next_opening()
            self.ledger.open(header)
        self.schedule = stage.prompt_schedule(config, list(self.prompts), self.ledger.rounds_opened)
        self.version = stage.last_published_iteration(out_dir)
        start = stage.iteration_dir(out_dir, self.version) if self.version else None
        self.engine = stage.engine_for(config, tokenizer, self.problems, start)
        self.refresh_diffs: list[float] = []

    def run(self) -> None:
        """Sample rounds until the run's last iteration has all it opens."""
        iterations = self.config.num_iterations(len(self.problems))
        max_staleness = self.config.asynchronous.max_staleness  # type: ignore[union-attr]
        while (iteration := self.ledger.next_opening()) <= iterations:
            idle_s = self._wait_for_weights(iteration - 1 - max_staleness)
            header, rows = self._sample(self.ledger.rounds_opened + 1, idle_s)
            write_round(self.folder, header, rows)
            self.ledger.open(header)
            self._stop_if_orphaned()

    def _wait_for_weights(self, oldest: int) -> float:
        """Serve the newest published weights, waiting until they are version ``oldest`` or
        newer; returns the seconds waited."""
        idle_s = 0.0
        self._serve_newest()
        while self.version < oldest:
            self._stop_if_orphaned()
            start = time.monotonic()
            time.sleep(POLL_S)
            idle_s += time.monotonic() - start
            self._serve_newest()
        return idle_s

    def _serve_newest(self) -> None:
        """Refresh the engine from the newest checkpoint the trainer published, and check it
        with the trainer's probe. A checkpoint deleted meanwhile (``save_total_limit``) is
        passed over for the one that replaced it."""
        from ..inference.sampling import WeightSyncError

        notice = self._notice()
        if notice is None or notice["iteration"] <= self.version:
            return
        try:
            diff = self.engine.refresh(Path(notice["checkpoint"]), notice["probe"])
        except (OSError, WeightSyncError):
            newer = self._notice()
            if newer is None or newer["iteration"] <= notice["iteration"]:
                raise
            return self._serve_newest()
        self.version = notice["iteration"]
        self.refresh_diffs.append(diff)

    def _notice(self) -> dict[str, Any] | None:
        path = self.folder / NOTICE
        return json.loads(path.read_text()) if path.is_file() else None

    def _sample(self, number: int, idle_s: float) -> tuple[RoundHeader, list[dict[str, Any]]]:
        """Round ``number``: its prompt batch sampled and scored, and the groups that enter the
        queue (dynamic sampling keeps the informative ones)."""
        from ..stages import rl as stage
        from ..stages.scoring import score_rollouts

        config = self.config
        task_ids = next(self.schedule)
        start = time.monotonic()
        rows = self.engine.sample(
            [self.prompts[task_id] for task_id in task_ids],
            stage.round_sampling(config, number),
            policy_version=self.version,
        )
        sampled = time.monotonic()
        scored = score_rollouts(rows, self.problems, config.scoring)
        metric = config.dynamic_sampling_metric
        queued = tuple(
            group[0]["prompt_id"]
            for group in stage.group_rows(scored)
            if not config.dynamic_sampling or stage.is_informative(group, metric)
        )
        header = RoundHeader(
            number=number,
            policy_version=self.version,
            first_group=self.ledger.queued,
            queued=queued,
            sample_s=sampled - start,
            score_s=time.monotonic() - sampled,
            idle_s=idle_s,
            refresh_probe_diff=max(self.refresh_diffs, default=None),
        )
        self.refresh_diffs = []
        return header, scored

    def _stop_if_orphaned(self) -> None:
        if os.getppid() != self.parent:  # the trainer was killed: a resumed run starts anew
            log.warning("the trainer (pid %d) is gone: the sampler stops", self.parent)
            raise SystemExit(0)


@contextlib.contextmanager
def _only_sampler(folder: Path, parent: int) -> Iterator[None]:
    """Hold the run's sampler lock: a sampler left by a killed trainer ends its round first
    (the kernel releases the lock when its process ends, however it ends)."""
    with (folder / LOCK).open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if os.getppid() != parent:
                    raise SystemExit(0) from None
                time.sleep(POLL_S)
        yield


def main(argv: list[str] | None = None) -> None:
    """The sampler's process of an asynchronous RL run, which the RL stage starts."""
    from ..resources import close_all

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--parent", type=int, required=True, help="the trainer's pid")
    parser.add_argument("--threads", type=int, required=True, help="torch's threads")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM (the trainer stopping it) ends it through its clean-up: engines, sandbox pools
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    folder = args.out_dir / QUEUE
    try:
        with _only_sampler(folder, args.parent):
            atomic.write_text(folder / PID, f"{os.getpid()}\n")
            config = _config(args.out_dir)
            settings = config.asynchronous
            assert settings is not None
            threads = args.threads
            if settings.sampler_cpus:
                os.sched_setaffinity(0, settings.sampler_cpus)
                threads = len(settings.sampler_cpus)
            import torch

            torch.set_num_threads(threads)
            _Sampler(config, args.out_dir, args.parent).run()
    except Exception as exc:
        atomic.write_text(folder / ERROR, f"{type(exc).__name__}: {exc}".replace("\n", " "))
        raise
    finally:
        close_all()


def _config(out_dir: Path) -> RLConfig:
    from ..stages.rl import RLConfig

    return RLConfig.model_validate_json((out_dir / "config.json").read_text())
