"""The app: its metrics, the pool's shared parts (``pool_app``), and verify-server's routes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor
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

from ...sandbox import (
    LANGUAGES,
    ExecutionResult,
    Job,
    SandboxPool,
    SandboxUnavailable,
)
from ..problems import (
    NAMED_PROBLEMS,
)
from ..serving import (
    ASGIApp,
    BodyBudget,
    Guard,
    HeldBodies,
    JSONAnswer,
    Receive,
    Scope,
    Send,
    answer_errors_plainly,
    busy,
)
from ..verifier import SampleError, Verifier
from .admission import START_MARGIN_S, Admission, JobQueue, KnownCaller, RetryPlaces, known_caller
from .config import PoolServerConfig, ServerConfig
from .run_code import RunCodeRequest, run_code_job, run_code_response
from .verify import VerifyRequest, request_problems


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
    # Inline problems are read, and their jobs built, in one thread: parsing their code holds
    # the interpreter lock (a piece at a time, up to its bound), and parsers side by side would
    # hold it in turns, stalling every other request and /health that much longer each.
    inline_reader = ThreadPoolExecutor(1, thread_name_prefix="inline-problems")
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
            if value > cap and name in request.model_fields_set:
                raise HTTPException(422, f"{name} {value} is over the server's maximum {cap}")
        request = request.model_copy(  # a default past the server's cap is held to it
            update={
                "timeout": min(request.timeout, config.max_timeout_s),
                "memory_mb": min(request.memory_mb, config.max_memory_mb),
            }
        )
        inline = isinstance(request.problems, list)
        if inline:
            problems = await asyncio.get_running_loop().run_in_executor(
                inline_reader, request_problems, request, config
            )
        else:
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
                verdicts = await verifier.averify(
                    problems, request.samples, prepare_in=inline_reader if inline else None
                )
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
