"""Deployments against a real Prefect server started by this test module: `codepost serve`
registers them, a run triggered through the API with parameters completes, the nightly cron
schedules future runs, and invalid parameters are refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from engines import TEST_ENGINE, saved_tiny_model
from processes import gone, wait_until
from servers import free_port

from codepost.pipeline.data.prompts import reference_answer

pytestmark = [pytest.mark.docker, pytest.mark.slow]


# Daily, 12 hours from now: the scheduler creates its runs, none of them starts during the module
# (a scheduled night would run the whole default job beside the tests).
CRON = f"0 {(time.gmtime().tm_hour + 12) % 24} * * *"


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    """A child in its own process group, so stopping it stops everything it started."""
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    # A shell's environment: importing TRL in this test process set VLLM_LOGGING_LEVEL=ERROR.
    shell = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    env = {
        **shell,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
    }
    prefect = str(Path(sys.executable).parent / "prefect")
    server = _start(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        home / "server.log",
    )
    codepost = str(Path(sys.executable).parent / "codepost")
    serving = None
    try:
        _wait(
            lambda: httpx.get(f"{api}/health", timeout=2).status_code == 200,
            120,
            home / "server.log",
        )
        serving = _start([codepost, "serve", "--cron", CRON], env, home / "serve.log")
        from codepost.flows.post_train import STAGE_FLOWS

        every = 1 + len(STAGE_FLOWS)  # nightly/nightly and each flow's on-demand
        _wait(lambda: _deployment_count(api) >= every, 240, home / "serve.log")
        yield api, env, home, serving.pid
    finally:
        if serving is not None:
            _stop(serving)
        _stop(server)


def _wait(ready, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"not ready after {timeout} s; log:\n{log.read_text()[-3000:]}")


def _deployment_count(api: str) -> int:
    return len(httpx.post(f"{api}/deployments/filter", json={}, timeout=5).json())


def _run_in(api: str, env: dict, code: str) -> subprocess.CompletedProcess:
    """Prefect client calls in a child with this server's settings (not the test process's)."""
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )


def test_a_run_triggered_through_the_api_with_parameters_completes(served, tmp_path):
    from datasets import Dataset

    from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set

    api, env, *_ = served
    (problem,) = load_problem_set(ProblemSet(limit=1)).values()
    rows = [{"prompt_id": problem.task_id, "group_index": 0, "completion_style": "chat",
             "completion": reference_answer(problem)}]  # fmt: skip
    Dataset.from_list(rows).to_parquet(str(tmp_path / "rollouts.parquet"))
    code = f"""
from prefect.deployments import run_deployment
run = run_deployment("score/on-demand", timeout=500, parameters={{
    "rollouts": "{tmp_path / "rollouts.parquet"}", "problems": {{"limit": 1}},
    "config": {{"workers": 1}}, "out_dir": "{tmp_path / "out"}"}})
print(run.state.type.value)
"""
    done = _run_in(api, env, code)
    assert done.stdout.strip().endswith("COMPLETED"), done.stderr[-2000:]
    scored = Dataset.from_parquet(str(tmp_path / "out" / "scored.parquet")).to_list()
    assert scored[0]["status"] == "passed"


def test_the_nightly_schedule_creates_future_runs(served):
    api, *_ = served
    deployments = httpx.post(f"{api}/deployments/filter", json={}, timeout=5).json()
    (nightly,) = [d for d in deployments if d["name"] == "nightly"]
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == [CRON]
    body = {"deployments": {"id": {"any_": [nightly["id"]]}},
            "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}  # fmt: skip
    _wait(
        lambda: len(httpx.post(f"{api}/flow_runs/filter", json=body, timeout=5).json()) >= 1,
        120,
        Path("/dev/null"),
    )


def test_invalid_parameters_are_refused(served):
    api, env, *_ = served
    code = """
from prefect.deployments import run_deployment
try:
    run_deployment("score/on-demand", timeout=0, parameters={"rollouts": "x", "config": {"workers": 0}})
except Exception as exc:
    print("REFUSED", exc)
"""
    done = _run_in(api, env, code)
    assert "REFUSED" in done.stdout and "workers" in done.stdout, done.stdout + done.stderr[-2000:]


def _logs(api: str, run_id: str) -> list[str]:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return [log["message"] for log in httpx.post(f"{api}/logs/filter", json=body, timeout=5).json()]


def _state(api: str, run_id: str) -> str:
    return httpx.get(f"{api}/flow_runs/{run_id}", timeout=5).json()["state"]["type"]


def _running(api: str, run_id: str) -> bool:
    state = _state(api, run_id)
    assert state in ("SCHEDULED", "PENDING", "RUNNING"), f"the run ended {state}"
    return True


def test_a_cancelled_run_stops_its_processes_and_their_logs_reach_the_run(served, tmp_path):
    from codepost.pipeline.data.problem_sets import ProblemSet
    from codepost.pipeline.inference.sampling import SamplingConfig
    from codepost.pipeline.stages.evaluation import EvalConfig

    api, env, _, serve_pid = served
    model = saved_tiny_model(tmp_path / "tiny", hidden_size=128)
    engine = TEST_ENGINE.model_copy(update={"max_model_len": 2048})
    sampling = SamplingConfig(num_generations=16, temperature=0.8, max_tokens=512)
    config = EvalConfig(problems=ProblemSet(limit=32), prompt_style="continuation",
                        sampled=True, sampling=sampling, engine=engine)  # fmt: skip
    code = f"""
from prefect.deployments import run_deployment
run = run_deployment("evaluate/on-demand", timeout=0, parameters={{
    "checkpoint": "{model.name_or_path}", "config": {config.model_dump(mode="json")!r},
    "out_dir": "{tmp_path / "out"}"}})
print(run.id)
"""
    run_id = _run_in(api, env, code).stdout.split()[-1]
    # The vLLM engine's process, a child of the run's stage worker, writes into the run's logs.
    engine_output = "Loading safetensors checkpoint shards"
    _wait(
        lambda: _running(api, run_id) and any(engine_output in m for m in _logs(api, run_id)),
        300,
        Path("/dev/null"),
    )
    # and its INFO log lines too (importing TRL would silence them; `codepost serve` keeps them)
    assert any("Initializing a V1 LLM engine" in m for m in _logs(api, run_id))
    started = _processes_of(run_id, serve_pid)
    assert any("EngineCore" in " ".join(p.cmdline()) for p in started), started
    assert _state(api, run_id) == "RUNNING"

    httpx.post(f"{api}/flow_runs/{run_id}/set_state", timeout=5,
               json={"state": {"type": "CANCELLING"}, "force": True})  # fmt: skip
    _wait(lambda: _state(api, run_id) == "CANCELLED", 120, Path("/dev/null"))
    wait_until(lambda: all(gone(p.pid) for p in started), 30)
    alive = [p for p in started if not gone(p.pid)]
    assert not alive, [" ".join(p.cmdline())[:200] for p in alive]


def _processes_of(run_id: str, serve_pid: int) -> list[psutil.Process]:
    """The flow run's process (the runner passes it the run's id) and everything it started."""
    for process in psutil.Process(serve_pid).children(recursive=True):
        try:
            if process.environ().get("PREFECT__FLOW_RUN_ID") == run_id:
                return [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no process runs flow run {run_id}")


def _run_nightly(api: str, env: dict, parameters: dict) -> str:
    """A run of nightly/nightly with ``parameters``, submitted; its id."""
    code = f"""
from prefect.deployments import run_deployment
print(run_deployment("nightly/nightly", timeout=0, parameters={parameters!r}).id)
"""
    done = _run_in(api, env, code)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


def _ended(api: str, run_id: str) -> str:
    """The run's final state type, waiting for it."""
    _wait(lambda: _state(api, run_id) in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED"), 300,
          Path("/dev/null"))  # fmt: skip
    return _state(api, run_id)


def test_a_night_refused_for_a_held_series_ends_cancelled_in_one_line(served, tmp_path):
    """Another night holds the series: the run ends Cancelled, one line in its log and in the
    serve terminal says why, and neither shows an error or a traceback."""
    from codepost.pipeline.nightly import NightlyConfig
    from codepost.pipeline.run_lock import run_folder_lock

    api, env, home, _ = served
    config = NightlyConfig(root=str(tmp_path), series="held")
    terminal = home / "serve.log"
    before = terminal.stat().st_size
    with run_folder_lock(config.series_dir):
        run_id = _run_nightly(api, env, {"night": "n1", "config": {"root": str(tmp_path),
                                                                   "series": "held"}})  # fmt: skip
        assert _ended(api, run_id) == "CANCELLED"
    why = re.compile(r"night n1 of held did not run: .* in use by pid \d+ .*: another night of "
                     r"this series is running")  # fmt: skip
    assert sum(bool(why.search(message)) for message in _logs(api, run_id)) == 1
    _wait(lambda: "Cancelled flow run" in terminal.read_text()[before:], 60, terminal)
    printed = terminal.read_text()[before:]
    assert len(why.findall(printed)) == 1, printed
    assert "Traceback" not in printed and "ERROR" not in printed, printed
    assert not (config.series_dir / "n1").exists()


def test_a_gate_naming_no_evaluation_is_refused_when_the_night_starts(served, tmp_path):
    """The form cannot compare the gate with the run's evaluations, so Prefect accepts the
    run; it fails as it starts, before it takes the series' lock, in one line."""
    api, env, *_ = served
    config = {"root": str(tmp_path), "series": "s", "gate": {"benchmark": "held-out"}}
    run_id = _run_nightly(api, env, {"night": "n1", "config": config})
    assert _ended(api, run_id) == "FAILED"
    message = httpx.get(f"{api}/flow_runs/{run_id}", timeout=5).json()["state"]["message"]
    assert message == ("Flow run encountered an exception: ParameterError: config: gate: "
                       "'held-out' is not one of run.evaluations (['humaneval'])")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_a_night_cancelled_from_prefect_records_its_decision(served, tmp_path):
    """Cancelled while its base evaluation runs: night.json says cancelled, the champion
    kept; the series' report has the night, and the run published the decision."""
    from codepost.pipeline.data.problem_sets import ProblemSet
    from codepost.pipeline.inference.sampling import SamplingConfig
    from codepost.pipeline.nightly import NightlyConfig
    from codepost.pipeline.nightly.records import NIGHT_RECORD, NightRecord
    from codepost.pipeline.post_train import PostTrainConfig
    from codepost.pipeline.stages.evaluation import EvalConfig

    api, env, *_ = served
    model = saved_tiny_model(tmp_path / "tiny", hidden_size=128)
    engine = TEST_ENGINE.model_copy(update={"max_model_len": 2048})
    sampling = SamplingConfig(num_generations=16, temperature=0.8, max_tokens=512)
    long = EvalConfig(problems=ProblemSet(limit=32), prompt_style="continuation",
                      sampled=True, sampling=sampling, engine=engine)  # fmt: skip
    run = PostTrainConfig(model=model, stages=[], evaluations={"tiny": long})
    config = NightlyConfig(root=str(tmp_path / "series"), series="c", run=run)
    run_id = _run_nightly(api, env, {"night": "n1", "config": config.model_dump(mode="json")})
    _wait(
        lambda: (
            _running(api, run_id)
            and any("Loading safetensors checkpoint shards" in m for m in _logs(api, run_id))
        ),
        600,  # the engine starts in minutes on a loaded 2-core machine
        Path("/dev/null"),
    )
    httpx.post(f"{api}/flow_runs/{run_id}/set_state", timeout=5,
               json={"state": {"type": "CANCELLING"}, "force": True})  # fmt: skip
    assert _ended(api, run_id) == "CANCELLED"

    decision = NightRecord.read(config.series_dir / "n1" / NIGHT_RECORD).decision
    assert decision is not None and decision.cancelled == "TerminationSignal"
    assert not decision.promoted and decision.champion == model.name_or_path
    report = (config.series_dir / "report.md").read_text()
    assert "| n1 |" in report and "the night was cancelled (TerminationSignal)" in report
    body = {"artifacts": {"key": {"any_": ["c-decision"]}}}
    (published,) = httpx.post(f"{api}/artifacts/filter", json=body, timeout=5).json()
    assert published["flow_run_id"] == run_id
    assert "# c, night n1: kept the champion" in published["data"]


def test_serve_refuses_a_series_that_would_fail_when_its_night_starts(tmp_path):
    """Checked at registration, as a night checks its config at its start: nothing served."""
    series = tmp_path / "s.yaml"
    missing = tmp_path / "gone.jsonl"
    series.write_text(
        f"series: s\nrun:\n  evaluations:\n    h: {{problems: {{source: {missing}}}}}\n"
    )
    codepost = str(Path(sys.executable).parent / "codepost")
    refused = subprocess.run(
        [codepost, "serve", "--series", str(series)],
        env={**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"},  # never reached
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        refused.stderr.strip()
        == f"codepost serve: invalid series {series}: no problem file at {missing}"
    )


def test_a_series_deployment_holds_only_what_its_file_sets():
    """A dump of every field would set each stage's seed in the night's parameters to its
    default, so every stage of every night would run on seed 0 instead of one derived from the
    run seed."""
    from codepost.flows.post_train import _validated
    from codepost.flows.serve import deployments
    from codepost.pipeline.nightly import NightlyConfig
    from codepost.pipeline.post_train import derive_seed, seeded

    stages = ["sft", {"stage": "rl", "config": {"sampling": {"seed": 5}}}]
    series = NightlyConfig.model_validate({"series": "s", "run": {"seed": 3, "stages": stages}})
    parameters = deployments(series=[series])[0].parameters["config"]
    assert parameters["run"]["stages"] == [{"stage": "sft"}, stages[1]]
    night = _validated(parameters, NightlyConfig, "config")
    rl = seeded(night.run.entry("rl").config, derive_seed(3, "rl"))
    assert (rl.seed, rl.sampling.seed) == (derive_seed(3, "rl"), 5)
