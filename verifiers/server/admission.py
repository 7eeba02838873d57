"""Work accepted and not answered yet: the admission that refuses past capacity (429), the
queue in front of the pool, and the callers whose deadline is known."""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import heapq
import itertools
import math
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from fastapi import HTTPException
from pydantic import (
    BaseModel,
)

from ...sandbox import (
    ExecutionResult,
    Job,
    SandboxUnavailable,
)
from ..serving import (
    BodyBudget,
    busy,
)
from ..verifier import Executor
from .run_code import RunCodeRequest


class Admission:
    """Counts the jobs accepted and not yet answered, and the bytes of the request bodies held
    (``bodies``), and refuses with 429 those past ``capacity`` jobs or ``capacity_bytes``.

    Used from the event loop only, so it needs no lock.
    """

    def __init__(self, capacity: int, retry_after_s: int, capacity_bytes: int) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self.bodies = BodyBudget(capacity_bytes, retry_after_s, 429)
        self.pending = 0  # jobs
        self.accepted = 0  # requests
        self.answered = 0

    @contextlib.contextmanager
    def admit(self, jobs: int, busy_status: int = 429) -> Iterator[None]:
        """Hold ``jobs`` until the block ends; past ``capacity``, refused with ``busy_status``
        (the status the caller retries)."""
        if jobs > self.capacity:
            raise HTTPException(
                413,
                f"{jobs} samples in one request, over the server's max_pending {self.capacity}:"
                " send them in batches",
            )
        if self.pending + jobs > self.capacity:
            what = f"{self.pending} of {self.capacity} jobs pending"
            raise busy(busy_status, what, self.retry_after_s)
        self.pending += jobs
        self.accepted += 1
        try:
            yield
        finally:
            self.pending -= jobs
            self.answered += 1


# -- the queue in front of the pool, and the callers whose deadline is known

RECENT_JOBS = 16  # the jobs whose times predict the next one's
# A job starts only if it can end this long before its caller's deadline: the answer's way back.
START_MARGIN_S = 2.0
RETRY_MEMORY_S = 600.0  # how long a refused request keeps its place for its retry


@dataclass(frozen=True)
class KnownCaller:
    """A client whose deadline and retries its code fixes: a request of its that cannot start
    in time is answered with ``retry_status``, which it retries, instead of running out."""

    name: str
    margin_s: float  # its deadline past the request's compile_timeout + run_timeout
    retry_status: int

    def deadline_s(self, request: RunCodeRequest) -> float:
        return request.compile_timeout + request.run_timeout + self.margin_s


# verl's reward (verl.utils.reward_score.sandbox_fusion): requests' read time-out of
# compile_timeout + run_timeout + API_TIMEOUT (10 s); it retries 504 only, three tries in all,
# 1 s then 2 s apart; any other refusal scores the case as failed (api_error).
VERL = KnownCaller("verl", margin_s=10.0, retry_status=504)


def known_caller(headers: Mapping[str, str]) -> KnownCaller | None:
    """verl sends requests' User-Agent with ``Accept: application/json`` of its own (the
    ``sandbox-fusion`` package, also on requests, sends requests' ``*/*`` and waits without a
    deadline; tinker-cookbook's client sends aiohttp's and waits 6000 s): the others wait for
    their answer however long the queue is."""
    if headers.get("user-agent", "").startswith("python-requests/") and (
        headers.get("accept") == "application/json"
    ):
        return VERL
    return None


class JobQueue:
    """The server's queue in front of its pool (``Executor``). Jobs start in order of arrival,
    a retried request's at the place of its first try (``order``); at most one job per
    container is handed to the pool at a time, so that a job not started yet can still be
    withdrawn (its future cancelled); and the last ``RECENT_JOBS`` jobs' times predict the
    next one's. Submitted from the event loop and from the pool's threads (a sample's next
    job), so it holds a lock."""

    def __init__(self, pool: Executor, workers: int) -> None:
        self.pool, self.workers = pool, workers
        self.lock = threading.Lock()
        self.waiting: list[tuple[float, int, Job, Future[ExecutionResult]]] = []  # a heap
        self.arrivals = itertools.count()
        self.running = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_JOBS)

    def submit(self, job: Job, order: float | None = None) -> Future[ExecutionResult]:
        future: Future[ExecutionResult] = Future()
        place = time.monotonic() if order is None else order
        with self.lock:
            heapq.heappush(self.waiting, (place, next(self.arrivals), job, future))
        self.dispatch()
        return future

    def dispatch(self) -> None:
        """Hand the pool the next jobs while it has a container free; a withdrawn job is
        skipped."""
        while True:
            with self.lock:
                if self.running >= self.workers or not self.waiting:
                    return
                _, _, job, future = heapq.heappop(self.waiting)
                if not future.set_running_or_notify_cancel():
                    continue
                self.running += 1
            started = time.monotonic()
            try:
                inner = self.pool.submit(job)
            except Exception as exc:  # a closed pool
                self.finished(future, started, None, exc)
                continue
            inner.add_done_callback(functools.partial(self.done, future, started))

    def done(
        self, future: Future[ExecutionResult], started: float, inner: Future[ExecutionResult]
    ) -> None:
        if inner.cancelled():
            self.finished(future, started, None, SandboxUnavailable("the pool was closed"))
        elif (error := inner.exception()) is not None:
            self.finished(future, started, None, error)
        else:
            self.finished(future, started, inner.result(), None)

    def finished(
        self,
        future: Future[ExecutionResult],
        started: float,
        result: ExecutionResult | None,
        error: BaseException | None,
    ) -> None:
        with self.lock:
            self.running -= 1
            if error is None:
                self.recent.append(time.monotonic() - started)
        self.dispatch()  # before the answer: a container is free now, whoever waits on it
        if error is None:
            assert result is not None
            future.set_result(result)
        else:
            future.set_exception(error)

    def expected_s(self, bound_s: float) -> float:
        """How long the next job will take: the longest of the recent ones, or ``bound_s``
        (its own time limit) before any has run, and never more than it."""
        with self.lock:
            return min(max(self.recent, default=bound_s), bound_s)

    def waiting_count(self) -> int:
        with self.lock:
            return sum(not entry[3].cancelled() for entry in self.waiting)

    def wait_s(self) -> float:
        """The queue's wait for a job submitted now: the jobs ahead of it, run ``workers`` at a
        time, each as long as the recent ones on average."""
        with self.lock:
            ahead = sum(not entry[3].cancelled() for entry in self.waiting)
            mean = sum(self.recent) / len(self.recent) if self.recent else 0.0
            free = self.running < self.workers and not ahead
        return 0.0 if free else math.ceil((ahead + 1) / self.workers) * mean


class RetryPlaces:
    """The first arrival of requests refused for time, by their content, so that a client's
    retry of the same request keeps the place of its first try (verl's third try is its
    last)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}

    @staticmethod
    def key(request: BaseModel) -> str:
        return hashlib.sha256(request.model_dump_json().encode(errors="surrogatepass")).hexdigest()

    def place(self, key: str) -> float:
        """When this request first arrived: now, unless it was refused before."""
        now = time.monotonic()
        for stale in [k for k, t in self.first.items() if now - t > RETRY_MEMORY_S]:
            del self.first[stale]
        return self.first.get(key, now)

    def refused(self, key: str, first: float) -> None:
        self.first[key] = first

    def served(self, key: str) -> None:
        self.first.pop(key, None)
