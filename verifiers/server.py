"""``codepost verify-server``: the warm sandbox pool behind an HTTP API, for any trainer.

* ``POST /run_code``: SandboxFusion's schema for the sandbox's languages (Python, C++), so its
  clients (the ``sandbox-fusion`` package, verl's ``reward_model.sandbox_fusion``) work
  unchanged;
* ``POST /verify``: ``codepost verify`` samples in, the same verdicts and rewards out;
* ``GET /health``, and ``GET /metrics`` in Prometheus text format.

Every job accepted is answered. The server holds at most ``max_pending`` jobs (running or
waiting for a container) and ``max_pending_bytes`` of request bodies, and refuses the next
request at once with 429 and Retry-After instead of building a backlog. A caller whose deadline
is known (verl's reward: its time-outs plus 10 s) is never left to run out of time in the queue:
a job of its that can no longer start in time is withdrawn unstarted and answered with the
status that caller retries (504), and its retry keeps its place. SIGTERM stops new
connections, lets the accepted requests finish, then closes the pool, so no container is left
behind. Hostile callers are bounded before the work is done: a body's size before it is read,
list lengths before their items are validated, an inline problem's size and test count before
its jobs are built (off the event loop, once per problem), and the size of every error answer.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import functools
import hashlib
import heapq
import itertools
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from ..sandbox import (
    LANGUAGES,
    MAX_PATHS,
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    Limits,
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
)
from ..settings.command_line import (
    EXIT_SANDBOX_UNAVAILABLE,
    refuse,
    server_settings,
    settings_command,
)
from .bounds import ReadingBounds, reading_within
from .languages import canonical_language
from .options import TOKEN_ENV, VerifyOptions
from .problems import (
    HUMANEVAL,
    NAMED_PROBLEMS,
    Problem,
    ProblemFormatError,
    cap_tests,
    load_problems,
    posed_in,
    problems_from_records,
)
from .serving import (
    ASGIApp,
    BodyBudget,
    Guard,
    HeldBodies,
    HTTPLimits,
    JSONAnswer,
    Receive,
    Scope,
    Send,
    answer_errors_plainly,
    busy,
    http_server,
)
from .verifier import Executor, SampleError, Verifier

MAX_ITEMS = 1 << 16  # samples, or inline problems, in one /verify request
MAX_DEPTH = 32  # lists and objects nested in one sample or inline problem
# How many times max_problem_bytes an inline problem's packed tests (LiveCodeBench's private
# tests) may unpack to: zlib and base64 pack test data 1.5-4.5x (large numbers 1.5x, a grid of
# '.' and '#' 4.5x), so honest tests fit, and a request holds at most 4x its body in them.
UNPACKED_PER_PROBLEM_BYTE = 4


class PoolServerConfig(HTTPLimits):
    """What a server of the sandbox pool listens on, how many containers it runs, the limits
    of its jobs, and the problems it accepts inline (``verify-server``, ``env-server``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="address to bind; only this machine by default")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (SandboxFusion's is 8080)")
    workers: int = Field(4, ge=1, description="sandbox containers: jobs running at once")
    max_timeout_s: float = Field(
        60.0, gt=0, description="cap on a request's run time-out and a problem's own time limit"
    )
    max_job_s: float = Field(
        120.0,
        gt=0,
        description="cap on one job's whole time: a program's compile and all its tests or "
        "cases together (a /run_code compile and run)",
    )
    max_memory_mb: int = Field(1024, ge=16, description="cap on a program's memory")
    max_problem_bytes: int = Field(
        1 << 20, ge=1024, description="largest inline problem (its JSON record)"
    )
    max_problem_tests: int = Field(
        1024, ge=1, description="most tests (asserts, cases, test functions) per inline problem"
    )
    max_problem_code_chars: int = Field(
        32 << 10,
        ge=1024,
        description="longest piece of Python code in an inline problem (its test module or "
        "test file, one assert, its setup code, a prompt that is code): parsing it holds the "
        "server's interpreter about 4 us a character, whatever else it serves",
    )
    shutdown_timeout_s: int = Field(
        120,
        ge=1,
        description="after SIGTERM, how long accepted requests may take to finish before the "
        "server stops anyway (a body being sent slowly would otherwise keep it up)",
    )


class ServerConfig(PoolServerConfig):
    """``verify-server``'s: its pool, and the work it holds at once."""

    max_pending: int = Field(
        256,
        ge=1,
        description="jobs accepted and not answered yet (running or queued); past it, 429 at "
        "once. Keep a trainer's own concurrency (verl's max_concurrent) within it",
    )
    max_code_bytes: int = Field(1 << 20, ge=1, description="largest program of /run_code")


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


class Metrics:
    """The Prometheus series of one server (its own registry, so two apps never mix)."""

    def __init__(self, config: ServerConfig, admission: Admission, jobs: JobQueue) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "codepost_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.results = Counter(
            "codepost_results",
            "/run_code statuses and /verify verdict statuses",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "codepost_request_duration_seconds",
            "time from request to answer, by endpoint and status code",
            ["endpoint", "code"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        gauges = {
            "codepost_pending_jobs": ("jobs accepted, not answered yet", lambda: admission.pending),
            "codepost_queue_depth": (
                "jobs accepted and waiting for a container",
                jobs.waiting_count,
            ),
            "codepost_queue_wait_seconds": (
                "the queue's wait for a job sent now: the jobs waiting, run --workers at a time, "
                "each as long as the recent ones",
                jobs.wait_s,
            ),
            "codepost_queue_capacity": ("max_pending", lambda: config.max_pending),
            "codepost_pending_bytes": (
                "bytes of request bodies held (being read, queued or running)",
                lambda: admission.bodies.held,
            ),
            "codepost_pool_size": ("sandbox containers", lambda: config.workers),
        }
        for name, (text, read) in gauges.items():
            Gauge(name, text, registry=self.registry).set_function(read)


class Counted:
    """ASGI middleware around everything else: the request counts and latency, by endpoint and
    status code, refusals included."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics
        self.routes = {"/run_code", "/verify", "/health", "/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        endpoint = scope["path"] if scope["path"] in self.routes else "other"
        code = 500

        async def counted_send(message: MutableMapping[str, Any]) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            self.metrics.requests.labels(endpoint, str(code)).inc()
            self.metrics.latency.labels(endpoint, str(code)).observe(time.perf_counter() - started)


# -- /run_code: SandboxFusion's schema


class RunCodeRequest(BaseModel):
    """SandboxFusion's request; fields it has for other languages (``args``) are ignored."""

    code: str
    language: str
    # The compile's own wall-clock limit (C++; Python compiles as it starts, in run_timeout),
    # held to max_timeout_s on both endpoints: verl sends its one time-out as both limits.
    compile_timeout: float = Field(10, gt=0)
    run_timeout: float = Field(10, gt=0)
    memory_limit_MB: int = -1  # -1: the server's maximum
    stdin: str | None = None
    # path -> base64; None entries are skipped, as there. Any values: a wrong one is named in a
    # 400 by run_code_job, never one validation error per item.
    files: dict[str, Any] = Field({}, max_length=MAX_PATHS)
    fetch_files: list[str] = Field([], max_length=MAX_PATHS)


def run_code_job(request: RunCodeRequest, config: ServerConfig) -> Job:
    """The io job for a request, within the server's caps; 4xx naming what is wrong. A
    language by any of its names (SandboxFusion's ``nodejs`` is ``javascript``)."""
    language = canonical_language(request.language)
    if language not in LANGUAGES:
        raise HTTPException(
            400,
            f"language {request.language!r} is not supported: this server runs "
            f"{', '.join(LANGUAGES)} only",
        )
    size = len(request.code.encode(errors="surrogatepass"))  # Job names what cannot travel
    if size > config.max_code_bytes:
        raise HTTPException(
            413, f"code is {size} bytes, over the server's limit of {config.max_code_bytes}"
        )
    files = {}
    for path, data in request.files.items():
        if data is None:
            continue
        if not isinstance(data, str):
            raise HTTPException(400, f"files[{path!r}]: expected base64 text or null")
        try:
            files[path] = base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise HTTPException(400, f"files[{path!r}]: not base64 ({exc})") from None
    memory = request.memory_limit_MB
    seconds = min(request.run_timeout, config.max_timeout_s)
    limits = Limits(
        wall_time_s=seconds,
        cpu_time_s=seconds,
        memory_mb=config.max_memory_mb if memory <= 0 else min(memory, config.max_memory_mb),
        compile_time_s=min(request.compile_timeout, config.max_timeout_s),
        job_time_s=config.max_job_s,
    )
    try:
        return Job(
            program=request.code,
            stdin_cases=(request.stdin or "",),
            limits=limits,
            files=files,
            fetch_files=tuple(request.fetch_files),
            language=language,
        )
    except ValueError as exc:  # a file path outside the working directory
        raise HTTPException(400, str(exc)) from None


def run_code_response(result: ExecutionResult, output_bytes: int) -> dict[str, Any]:
    """SandboxFusion's answer: Success (it compiled and exited 0), Failed (it did not compile,
    or a non-zero exit or a time limit), or SandboxError (the sandbox itself failed; never the
    program's doing). ``compile_result`` is the compiler's run (compiled languages only);
    ``run_result`` is absent when the program did not compile, as there."""
    compile_result = (
        None if result.compile is None else _command_result(result.compile, output_bytes)
    )
    if result.status is ExecStatus.COMPILE_ERROR:
        return {
            "status": "Failed",
            "message": "",
            "compile_result": compile_result,
            "run_result": None,
            "executor_pod_name": None,
            "files": {},
        }
    if not result.cases:
        message = result.error or "the sandbox returned no result"
        return {
            "status": "SandboxError",
            "message": message,
            "compile_result": compile_result,
            "run_result": {"status": "Error", "stdout": "", "stderr": message},
            "executor_pod_name": None,
            "files": {},
        }
    case = result.cases[0]
    run_result = _command_result(case, output_bytes)
    failed = run_result["status"] == "TimeLimitExceeded" or run_result["return_code"] != 0
    return {
        "status": "Failed" if failed else "Success",
        "message": "",
        "compile_result": compile_result,
        "run_result": run_result,
        "executor_pod_name": None,
        "files": {path: base64.b64encode(data).decode() for path, data in case.files.items()},
    }


def _command_result(outcome: CaseOutcome | CompileOutcome, output_bytes: int) -> dict[str, Any]:
    """SandboxFusion's ``CommandRunResult`` for a run or a compile: Finished with its return
    code (a process stopped for its output: -9, and stderr says why), or TimeLimitExceeded
    without one."""
    stderr, return_code = outcome.stderr, outcome.exit_code
    if outcome.status is ExecStatus.OUTPUT_LIMIT:
        stderr += f"\n[sandbox] output over {output_bytes} bytes: the program was killed\n"
        return_code = -signal.SIGKILL
    elif return_code is None:  # it did not compile (or its files did not fit): Python exits 1
        return_code = 1
    timed_out = outcome.status is ExecStatus.TIMEOUT
    return {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": outcome.duration_s,
        "return_code": None if timed_out else return_code,
        "stdout": outcome.stdout,
        "stderr": stderr,
    }


# -- /verify: codepost's own


class VerifyRequest(VerifyOptions):
    """``codepost verify`` in a request: its samples, problems and options."""

    samples: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)
    problems: str | list[dict[str, Any]] = Field(
        HUMANEVAL,
        max_length=MAX_ITEMS,
        description=f"one of {', '.join(NAMED_PROBLEMS)}, or problem records inline",
    )

    @field_validator("samples", "problems")
    @classmethod
    def _shallow(cls, items: str | list[dict[str, Any]], info: ValidationInfo) -> Any:
        if isinstance(items, list):
            for index, item in enumerate(items):
                if nesting_depth(item) > MAX_DEPTH:
                    raise ValueError(
                        f"{info.field_name}[{index}] is nested over {MAX_DEPTH} levels deep"
                    )
        return items


def nesting_depth(value: Any) -> int:
    """How deep lists and objects nest in ``value``, parsed JSON (iteratively: a sample nested
    900 deep passed the parser, then broke the answer's serialiser after every job had run)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


@functools.cache
def named_problems(name: str) -> dict[str, Problem]:
    return load_problems(name)


def request_problems(request: VerifyRequest, config: ServerConfig) -> dict[str, Problem]:
    """The request's problems, at most ``max_tests`` tests each and within the server's time
    and memory caps. Run off the event loop: inline test code is parsed here."""
    try:
        problems = posed_in(named_or_inline(request.problems, config), request.language)
    except ProblemFormatError as exc:
        raise HTTPException(422, f"language: {exc}") from None
    problems = cap_tests(problems, request.max_tests)
    if isinstance(request.problems, list):
        check_test_counts(problems, config, "send fewer, or set max_tests")
    return within_caps(problems, config)


def check_test_counts(problems: dict[str, Problem], config: PoolServerConfig, advice: str) -> None:
    """413 naming an inline problem with more tests than the server's ``max_problem_tests``."""
    for task_id, problem in problems.items():
        count = problem.tests.count()
        if count > config.max_problem_tests:
            raise HTTPException(
                413,
                f"problem {task_id!r} has {count} tests, over the server's max_problem_tests "
                f"{config.max_problem_tests}: {advice}",
            )


def named_or_inline(
    problems: str | list[dict[str, Any]], config: PoolServerConfig
) -> dict[str, Problem]:
    """Problems by name (the sets shipped with codepost) or inline, each inline record at most
    ``max_problem_bytes``; never a path or a hub id, so no request makes the server read its
    disk or the network."""
    if isinstance(problems, str):
        if problems not in NAMED_PROBLEMS:
            raise HTTPException(
                422,
                f"unknown problem set {problems!r}: named sets are {', '.join(NAMED_PROBLEMS)};"
                " send other problems inline",
            )
        return named_problems(problems)
    for index, record in enumerate(problems):
        size = len(json.dumps(record))
        if size > config.max_problem_bytes:
            raise HTTPException(
                413,
                f"problems[{index}] is {size} bytes of JSON, over the server's "
                f"max_problem_bytes {config.max_problem_bytes}",
            )
    bounds = ReadingBounds(
        unpacked_bytes=UNPACKED_PER_PROBLEM_BYTE * config.max_problem_bytes,
        code_chars=config.max_problem_code_chars,
    )
    try:
        with reading_within(bounds):
            return problems_from_records((f"problems[{i}]", r) for i, r in enumerate(problems))
    except ProblemFormatError as exc:
        raise HTTPException(422, f"problems: {exc}") from None


def within_caps(problems: dict[str, Problem], config: PoolServerConfig) -> dict[str, Problem]:
    """The problems with their own time and memory limits (a request's inline records may
    carry any) no higher than the server's caps."""
    return {
        task_id: problem.model_copy(
            update={
                "time_limit_s": problem.time_limit_s
                and min(problem.time_limit_s, config.max_timeout_s),
                "memory_limit_mb": problem.memory_limit_mb
                and min(problem.memory_limit_mb, config.max_memory_mb),
            }
        )
        for task_id, problem in problems.items()
    }


# -- the app


def pool_app(title: str, summary: str, config: PoolServerConfig, bodies: BodyBudget) -> FastAPI:
    """A pool server's app: JSON answers; the token and body limits, then the bodies held
    (``bodies``), before any route; refusals in one line; 503 while the sandbox is away."""
    app = FastAPI(title=title, summary=summary, default_response_class=JSONAnswer)
    # The last added runs first: the token and body limits, then the bodies held.
    app.add_middleware(HeldBodies, budget=bodies)
    app.add_middleware(Guard, limits=config)
    answer_errors_plainly(app)

    @app.exception_handler(SandboxUnavailable)
    async def unavailable(request: Request, exc: SandboxUnavailable) -> JSONAnswer:
        return JSONAnswer({"detail": f"sandbox unavailable: {exc}"}, status_code=503)

    return app


def create_app(config: ServerConfig, pool: SandboxPool) -> FastAPI:
    """The server's app over a started ``pool``, which stays the caller's to close."""
    admission = Admission(config.max_pending, config.retry_after_s, config.max_pending_bytes)
    jobs = JobQueue(pool, config.workers)
    retries = RetryPlaces()
    metrics = Metrics(config, admission, jobs)
    app = pool_app(
        "codepost verify-server",
        "SandboxFusion-compatible /run_code and codepost's /verify",
        config,
        admission.bodies,
    )
    app.state.admission = admission
    app.add_middleware(Counted, metrics=metrics)  # around the others: refusals are counted

    async def in_time(job: Job, request: RunCodeRequest, caller: KnownCaller) -> ExecutionResult:
        """The job's result; or, once it can no longer start and still end within the caller's
        deadline, the job withdrawn unstarted and the status the caller retries."""
        arrived, key = time.monotonic(), RetryPlaces.key(request)
        first = retries.place(key)
        future = jobs.submit(job, order=first)
        answer = asyncio.wrap_future(future)
        deadline_s = caller.deadline_s(request)
        end_by = arrived + deadline_s - START_MARGIN_S
        while not (future.running() or future.done()):
            expected_s = jobs.expected_s(job.limits.wall_time_s)
            start_by = end_by - expected_s
            if time.monotonic() >= start_by and future.cancel():
                retries.refused(key, first)
                what = (
                    f"this job cannot start in time to end within {caller.name}'s "
                    f"{deadline_s:g} s ({jobs.waiting_count()} jobs waiting for "
                    f"{config.workers} containers, up to {expected_s:.1f} s each)"
                )
                raise busy(caller.retry_status, what, config.retry_after_s)
            await asyncio.wait({answer}, timeout=min(1.0, max(0.0, start_by - time.monotonic())))
        retries.served(key)
        return await answer

    @app.post("/run_code")
    async def run_code(request: RunCodeRequest, http: Request) -> JSONAnswer:
        job = run_code_job(request, config)
        caller = known_caller(http.headers)
        with admission.admit(1, 429 if caller is None else caller.retry_status):
            if caller is None:
                result = await asyncio.wrap_future(jobs.submit(job))
            else:
                result = await in_time(job, request, caller)
        answer = run_code_response(result, job.limits.output_bytes)
        metrics.results.labels("run_code", answer["status"]).inc()
        return JSONAnswer(answer)

    @app.post("/verify")
    async def verify(request: VerifyRequest) -> JSONAnswer:
        for name, value, cap in (
            ("timeout", request.timeout, config.max_timeout_s),
            ("memory_mb", request.memory_mb, config.max_memory_mb),
        ):
            if value > cap:
                raise HTTPException(422, f"{name} {value} is over the server's maximum {cap}")
        problems = await asyncio.to_thread(request_problems, request, config)
        limits = request.limits(job_time_s=config.max_job_s)
        verifier = Verifier(
            jobs,
            limits=dataclasses.replace(
                limits, compile_time_s=min(limits.compile_time_s, config.max_timeout_s)
            ),
            reward_config=request.reward_config(),
            completion_style=request.completion_style,
        )
        with admission.admit(len(request.samples)):
            try:
                verdicts = await verifier.averify(problems, request.samples)
            except SampleError as exc:
                detail = {"detail": str(exc), "index": exc.index, "reason": exc.reason}
                return JSONAnswer(detail, status_code=422)
        for verdict in verdicts:
            metrics.results.labels("verify", verdict.status.value).inc()
        return JSONAnswer({"verdicts": [verdict.model_dump(mode="json") for verdict in verdicts]})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "languages": list(LANGUAGES),
            "problems": list(NAMED_PROBLEMS),
            "workers": config.workers,
            "max_pending": config.max_pending,
            "pending": admission.pending,
            "queued": jobs.waiting_count(),
            "estimated_wait_s": round(jobs.wait_s(), 3),
            "max_timeout_s": config.max_timeout_s,
            "max_job_s": config.max_job_s,
            "max_memory_mb": config.max_memory_mb,
            "max_body_bytes": config.max_body_bytes,
            "pending_bytes": admission.bodies.held,
            "max_pending_bytes": config.max_pending_bytes,
            "max_problem_bytes": config.max_problem_bytes,
            "max_problem_tests": config.max_problem_tests,
            "max_problem_code_chars": config.max_problem_code_chars,
            "max_code_bytes": config.max_code_bytes,
        }

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


# -- the command


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``verify-server`` subcommand to a ``codepost``-style subparsers object."""
    parser = settings_command(
        subparsers,
        "verify-server",
        ServerConfig,
        example="--port 8080 --workers 8 --max-timeout-s 30",
        help="serve the sandbox over HTTP: SandboxFusion's /run_code, /verify, /health, /metrics",
        description=(
            "Serve the warm sandbox pool over HTTP: POST /run_code (SandboxFusion's schema, "
            "Python), POST /verify (codepost verify's samples in, its verdicts out), GET /health "
            "and GET /metrics. Binds to 127.0.0.1 unless --host says otherwise; the bearer token "
            f"is ${TOKEN_ENV} unless --token gives one. SIGTERM lets the accepted requests "
            "finish, then removes the containers."
        ),
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        config = server_settings(ServerConfig, args, TOKEN_ENV)
    except (ValueError, OSError) as exc:  # SettingsError, ValidationError, an unreadable file
        return refuse("verify-server", "invalid settings", exc)
    return serve(config)


def serve(config: ServerConfig) -> int:
    """Start the pool, serve until SIGTERM or Ctrl-C, then close the pool."""

    def stopped(app: FastAPI) -> str:
        admission: Admission = app.state.admission
        return f"{admission.accepted} requests accepted, {admission.answered} answered"

    return serve_pool(
        "verify-server",
        config,
        functools.partial(create_app, config),
        f"up to {config.max_pending} jobs pending",
        stopped,
    )


def serve_pool(
    name: str,
    config: PoolServerConfig,
    create: Callable[[SandboxPool], FastAPI],
    serving: str,
    stopped: Callable[[FastAPI], str],
) -> int:
    """Start a pool and the app ``create`` makes over it, serve until SIGTERM or Ctrl-C, then
    close the pool; ``serving`` and ``stopped`` say what it holds and what it did."""
    # SIGTERM as Ctrl-C: it stops a start-up cleanly, and uvicorn, which drains the server on
    # either, raises the signal again once done: both end here, with the pool closed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pool = SandboxPool(PoolConfig(size=config.workers))
    app = create(pool)
    server = http_server(
        app,
        host=config.host,
        port=config.port,
        limits=config,
        shutdown_timeout_s=config.shutdown_timeout_s,
    )
    try:
        pool.start()
        print(
            f"codepost {name}: http://{config.host}:{config.port} ({config.workers} "
            f"containers, {serving}{', bearer token required' if config.token else ''})",
            file=sys.stderr,
            flush=True,
        )
        server.run()
    except SandboxUnavailable as exc:
        print(f"sandbox unavailable: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_UNAVAILABLE
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    print(
        f"codepost {name}: stopped; {stopped(app)}; the sandbox containers are removed",
        file=sys.stderr,
        flush=True,
    )
    return 0 if server.started else 1
