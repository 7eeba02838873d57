"""`codepost run` when things go wrong: settings it cannot use are refused before Prefect starts, naming
what is wrong (exit 2); a stage that fails ends the run with its error and how to resume
(exit 1) instead of raising out of the command; a killed run leaves no Prefect server behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from engines import saved_tiny_model
from processes import busy_cores, drop_page_caches, gone, wait_until
from servers import free_port

from codepost.flows import cli
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish
from codepost.settings.command_line import EXIT_BAD_INPUT, EXIT_SANDBOX_UNAVAILABLE


def _config(tmp_path: Path, settings: object) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def _stage(stage: str, **config: object) -> dict[str, object]:
    return {"stage": stage, "config": config}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"run_dir": "x", "learning_rate": 1e-5}, "learning_rate"),
        (
            {"stages": [{"stage": "rl", "config": {"iterations": 0}}]},
            "stages[0].config.iterations = 0: Input should be greater than or equal to 1",
        ),
        ({"stages": ["sft", "dpo"]}, "(dpo) needs pairs"),
        ({"model": {"name_or_path": "/nonexistent/model"}}, "'/nonexistent/model'"),
        (["sft", "rl"], "expected a mapping"),
        # vLLM takes the CPU KV cache as whole GiB: 0.5 failed inside the first evaluation
        (
            {"evaluations": {"humaneval": {"engine": {"cpu_kv_cache_gib": 0.5}}}},
            "evaluations.humaneval.engine.cpu_kv_cache_gib",
        ),
        (
            {"stages": [_stage("rl", sampling={"temperature": 2.5})]},
            "stages[0].config.sampling.temperature = 2.5",
        ),
        (
            {"evaluations": {"humaneval": {"sampling": {"temperature": 3}}}},
            "evaluations.humaneval.sampling.temperature",
        ),
        ({"stages": [_stage("rl", sampling={"temperature": 0})]}, "sampling.temperature=0"),
        (
            {
                "stages": [
                    _stage("rl", sampling={"num_generations": 1}, update={"algorithm": "rloo"})
                ]
            },
            "sampling.num_generations=1",
        ),
        ({"stages": [_stage("rl", sampling={"max_tokens": 2048})]}, "sampling.max_tokens=2048"),
        (
            {"stages": [_stage("rollouts", sampling={"max_tokens": 4096})]},
            "sampling.max_tokens=4096",
        ),
        (
            {
                "evaluations": {
                    "humaneval": {
                        "sampling": {"max_tokens": 4000},
                        "engine": {"max_model_len": 4000},
                    }
                }
            },
            "max_tokens=4000",
        ),
        ({"stages": [_stage("filter", engine={"max_model_len": 256})]}, "engine.max_model_len=256"),
        ({"report_to": ["tensorbord"]}, "report_to[0] = 'tensorbord'"),
    ],
)
def test_settings_it_cannot_use_are_refused_naming_the_problem(tmp_path, capsys, settings, named):
    argv = ["run", "--config", _config(tmp_path, settings), "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == EXIT_BAD_INPUT
    assert named in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_a_config_that_is_not_yaml_is_refused_naming_the_file_and_line(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("run_dir: x\nstages: [sft\n")
    argv = ["run", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert str(config) in err and "line 3" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.docker  # the run checks the sandbox before it starts
def test_a_failing_stage_ends_the_run_with_its_error_and_how_to_resume(
    prefect_api, tmp_path, capsys
):
    model = saved_tiny_model(tmp_path / "tiny").name_or_path
    (Path(model) / "model.safetensors").write_bytes(b"overwritten")  # found when it is loaded
    settings = {
        "model": {"name_or_path": model},
        "stages": [],
        "evaluations": {
            "tiny": {
                "problems": {"limit": 1},
                "prompt_style": "continuation",
                "engine": {"backend": "hf"},
            }
        },
    }
    run_dir = tmp_path / "run"
    argv = ["run", "--config", _config(tmp_path, settings), "--run-dir", str(run_dir)]
    assert cli.main(argv) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"model {model}: unreadable weights" in err, err
    assert err.endswith(f"kept in {run_dir}: the same command resumes after the last one.")


def test_a_model_edited_after_it_was_published_is_refused_before_anything_starts(tmp_path, capsys):
    """Its weights replaced under an intact manifest: the first stage refused it inside
    Prefect, with a traceback and a line saying the same command resumes."""

    def write(target: Path) -> None:
        (target / "config.json").write_text('{"model_type": "llama"}')
        (target / "model.safetensors").write_bytes(b"weights v1")

    model = tmp_path / "published"
    publish(model, write, CheckpointManifest(stage="sft", version="v1"))
    (model / "model.safetensors").write_bytes(b"weights v2, longer")
    config = _config(tmp_path, {"model": {"name_or_path": str(model)}})
    assert cli.main(["run", "--config", config, "--run-dir", str(tmp_path / "run")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{model}/model.safetensors: sha256 differs from the manifest" in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_a_malformed_problems_file_is_refused_before_anything_starts(tmp_path, capsys):
    problems = tmp_path / "problems.jsonl"
    good = (
        '{"task_id": "t%d", "prompt": "def f():\\n", "entry_point": "f", '
        '"test": "def check(candidate): pass"}\n'
    )
    problems.write_text(good % 1 + good % 2 + good % 3 + '{"task_id": "broken", "prompt": \n')
    settings = {"stages": [_stage("rl", problems={"source": str(problems), "split": "all"})]}
    argv = ["run", "--config", _config(tmp_path, settings), "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == EXIT_BAD_INPUT
    assert f"{problems}:4" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run").exists()


def test_a_dead_docker_engine_is_named_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # nothing listens there
    argv = ["run", "--config", _config(tmp_path, {"stages": []}), "--run-dir", str(tmp_path / "r")]
    assert cli.main(argv) == EXIT_SANDBOX_UNAVAILABLE
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot reach the Docker engine" in err and "127.0.0.1:9" in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.docker
def test_a_dead_sample_server_is_named_before_anything_starts(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = {"stages": [{"stage": "rl", "config": {"engine": {"server_url": url}}}]}
    argv = ["run", "--config", _config(tmp_path, settings), "--run-dir", str(tmp_path / "r")]
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert f"a sample server is unavailable: no codepost sample-server answers at {url}" in err
    assert not (tmp_path / "r").exists()


def _start_run(tmp_path: Path, log: Path, problems: int = 2, **env_vars: str) -> subprocess.Popen:
    """``codepost run`` of a tiny evaluation as a newcomer starts it: its own process, no
    PREFECT_API_URL (Prefect's ephemeral server) and a PREFECT_HOME with no database yet."""
    settings = {
        "model": {"name_or_path": saved_tiny_model(tmp_path / "tiny").name_or_path},
        "stages": [],
        "evaluations": {"tiny": {"problems": {"limit": problems}, "prompt_style": "continuation",
                                 "sampling": {"max_tokens": 8}, "engine": {"backend": "hf"}}},
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # ephemeral mode
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env.update(env_vars)
    codepost = str(Path(sys.executable).parent / "codepost")
    argv = [codepost, "run", "--config", _config(tmp_path, settings),
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    with log.open("w") as output:
        return subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
def test_a_first_run_on_a_busy_machine_gets_past_prefects_start(tmp_path):
    """The ephemeral server's first start (a new database to migrate, cold imports) took 25 s
    on a quiet 2-core machine and 41-75 s with its cores busy (cold page cache): Prefect's default 20 s wait ended
    newcomers' first runs before their first stage."""
    log = tmp_path / "run.log"
    drop_page_caches()
    run = None
    try:
        with busy_cores(4 * (os.cpu_count() or 1)):
            run = _start_run(tmp_path, log)
            # Past Prefect's start when its first step starts: the rest may run unloaded.
            past_start = wait_until(
                lambda: "[1/1] base/tiny: started" in log.read_text() or run.poll() is not None, 900
            )
            assert past_start and run.poll() in (None, 0), log.read_text()[-3000:]
        assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if run is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    assert (tmp_path / "run" / "report.md").exists()


@pytest.mark.docker
def test_a_prefect_server_that_does_not_start_is_one_line_naming_the_fix(tmp_path):
    log = tmp_path / "run.log"
    run = _start_run(tmp_path, log, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    assert run.wait(timeout=300) == EXIT_BAD_INPUT
    output = log.read_text()
    assert "Traceback" not in output, output
    assert "did not answer within 1 s" in output and "PREFECT_API_URL" in output, output
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher" in output, output


@pytest.mark.docker
def test_a_killed_run_takes_its_ephemeral_prefect_server_with_it(tmp_path):
    """Prefect stops its ephemeral server at a normal exit only; SIGKILL the run instead."""
    run = _start_run(tmp_path, tmp_path / "run.log")
    try:
        _wait_for_child(run, "codepost.flows.stage_worker", timeout=300)  # the run is under way
        server = _wait_for_child(run, "uvicorn", timeout=1)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        assert wait_until(lambda: gone(server.pid), 20), "the ephemeral server outlived the run"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)


@pytest.mark.docker
def test_a_stopped_run_says_how_to_resume(tmp_path):
    """SIGTERM, as a service manager or a scheduler's time limit stops a run: Prefect records
    the flow run as crashed; then the run says what is kept and how to go on (only Prefect's
    server stopping at the exit may follow)."""
    log = tmp_path / "run.log"
    run = _start_run(tmp_path, log, problems=164)  # minutes of sampling: still under way
    try:
        _wait_for_child(run, "codepost.flows.stage_worker", timeout=300)
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    output = " ".join(log.read_text().split())
    said = output.rfind(
        "codepost run: stopped by SIGTERM Finished stages are kept in "
        f"{tmp_path / 'run'}: the same command resumes after the last one."
    )
    assert said > output.rfind("Crash detected!") > 0, output[-3000:]  # after Prefect's own


def _wait_for_child(process: subprocess.Popen, name: str, timeout: float) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the run ended (exit {process.returncode}) first"
        for child in psutil.Process(process.pid).children():
            with contextlib.suppress(psutil.Error):
                if name in " ".join(child.cmdline()):
                    return child
        time.sleep(0.2)
    raise AssertionError(f"no {name} child after {timeout} s")


@pytest.mark.docker
def test_a_second_run_on_a_folder_in_use_is_refused_at_once_naming_the_holder(tmp_path, capsys):
    from codepost.pipeline.run_lock import run_folder_lock

    run_dir = tmp_path / "run"
    with run_folder_lock(run_dir):
        assert cli.main(["run", "--run-dir", str(run_dir)]) == EXIT_BAD_INPUT
    assert f"in use by pid {os.getpid()} on " in " ".join(capsys.readouterr().err.split())


@pytest.mark.docker
def test_the_run_folder_is_locked_before_prefect_starts_and_stays_locked(tmp_path, monkeypatch):
    """Two runs started in the same instant both passed a check that took the lock and let it
    go before Prefect started; the run now holds it from the check to its end."""
    import threading

    from codepost.flows import run as run_command
    from codepost.flows.ephemeral import EphemeralServerError
    from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock

    run_dir = tmp_path / "run"
    seen = []

    def try_lock() -> None:  # another run: a thread has a context of its own
        try:
            with run_folder_lock(run_dir):
                seen.append("free")
        except RunFolderLocked:
            seen.append("held")

    def prefect_starts() -> None:
        thread = threading.Thread(target=try_lock)
        thread.start()
        thread.join()
        raise EphemeralServerError("stop here")

    monkeypatch.setattr(run_command, "start_ephemeral_server", prefect_starts)
    assert cli.main(["run", "--run-dir", str(run_dir)]) == EXIT_BAD_INPUT
    assert seen == ["held"]
    try_lock()  # and released when the command ends
    assert seen == ["held", "free"]


def test_every_docker_engine_a_stage_scores_on_is_checked_before_anything_starts(tmp_path, capsys):
    gone_host = f"unix://{tmp_path}/no-engine.sock"
    scoring = {"scoring": {"sandbox": {"docker_hosts": [gone_host]}}}
    settings = {"stages": [{"stage": "rl", "config": scoring}]}
    argv = ["run", "--config", _config(tmp_path, settings), "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == EXIT_SANDBOX_UNAVAILABLE
    err = "".join(capsys.readouterr().err.split())  # rich wraps long paths anywhere
    assert f"cannotreachtheDockerengineat{gone_host}" in err
    assert not (tmp_path / "run").exists()
