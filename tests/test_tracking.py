"""Experiment trackers, each for real and offline: a run's parameters, evaluations and artifacts
from the run side, and a stage's metrics from another process (as the stage worker logs them),
all at the run's step, read back with each tracker's own reader (tests/tracker_readers.py); a
tracker's service checked in seconds before a run starts (real sockets on loopback), a resumed
run's TensorBoard points, a trainer's logs at the run's step, and a tracker that fails mid-run
(a store gone bad, a full disk) named while the run goes on."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from endpoints import closed_port_url, silent_listener_url
from processes import wait_until
from servers import free_port
from tracker_readers import made_checkpoint, offline, read, tensorboard_points

from codepost.flows import cli
from codepost.pipeline import tracking
from codepost.pipeline.endpoints import ask
from codepost.pipeline.tracking import (
    TRACKERS,
    RunTracking,
    TrackerUnavailable,
    evaluation_metrics,
)
from codepost.settings.command_line import EXIT_BAD_INPUT

STAGE_SIDE = """
import sys
from codepost.pipeline import tracking
for step in (1, 2):
    tracking.log_stage_metrics({"iteration": step, "reward/mean": step / 10,
                                "update/response_length/max": 7.0, "sampler/kl": float("nan")}, step)
tracking.close_stage_runs()
print("imported:", sorted(m for m in ("mlflow", "wandb", "trackio", "tensorboard") if m in sys.modules))
"""


def _evaluation(folder: Path, passed: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "evaluation.json").write_text(json.dumps({
        "checkpoint": "x", "num_problems": 4,
        "greedy": {"pass@1": passed, "pass@1_ci95": [0.0, 0.9], "samples": 4, "passed": 1},
    }))  # fmt: skip
    return folder


def test_evaluation_metrics_carry_pass_at_k_and_its_interval():
    results = {"greedy": {"pass@1": 0.25, "pass@1_ci95": [0.1, 0.5]},
               "sampled": {"pass@1": 0.2, "pass@1_ci95": None, "pass@8": float("nan")}}  # fmt: skip
    assert evaluation_metrics("humaneval", results) == {
        "eval/humaneval/greedy/pass_at_1": 0.25,
        "eval/humaneval/greedy/pass_at_1_ci95_low": 0.1,
        "eval/humaneval/greedy/pass_at_1_ci95_high": 0.5,
        "eval/humaneval/sampled/pass_at_1": 0.2,
    }


def test_no_tracker_is_imported_unless_asked_for(tmp_path):
    out = subprocess.run([sys.executable, "-c", STAGE_SIDE], capture_output=True, text=True,
                         check=True, env={**os.environ, tracking.STAGE_ENV: "rl"})  # fmt: skip
    assert "imported: []" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("tracker", sorted(TRACKERS))
def test_a_run_and_a_stage_in_another_process_reach_the_tracker(tracker, tmp_path, monkeypatch):
    offline(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    config = {"seed": 3, "stages": [{"stage": "rl", "config": {"iterations": 2}}]}
    with RunTracking([tracker], run_dir, config) as run:
        run.log_evaluation("base", "tiny", _evaluation(tmp_path / "e0", 0.25))
        run.made(made_checkpoint(tmp_path / "sft", steps=3))  # 3 optimizer steps: step 3
        with run.stage("rl"):  # as the stage worker gets it: the caller's environment
            subprocess.run([sys.executable, "-c", STAGE_SIDE], check=True, env=dict(os.environ))
        run.made(made_checkpoint(tmp_path / "rl", steps=2))  # 2 iterations: step 5
        run.log_evaluation("rl", "tiny", _evaluation(tmp_path / "e1", 0.5))
        run.log_metrics({"gate/promoted": 1.0, "gate/p_value": 0.03125})  # a nightly's decision
        report, plot = run_dir / "report.md", run_dir / "pass_at_1.png"
        run_dir.mkdir(exist_ok=True)
        report.write_text("# report\n")
        _png(plot)
        run.log_artifacts([report, plot])
    assert tracking.ENV not in os.environ  # the environment is as it was

    logged = read(tracker, run_dir)
    assert logged.params["seed"] == "3" or logged.params["seed"] == 3
    assert str(logged.params["stages.0.config.iterations"]) == "2"
    assert logged.runs["run"]["eval/tiny/greedy/pass_at_1"] == pytest.approx({0: 0.25, 5: 0.5})
    assert logged.runs["run"]["eval/tiny/greedy/pass_at_1_ci95_high"] == pytest.approx(
        {0: 0.9, 5: 0.9}
    )
    assert logged.runs["run"]["gate/p_value"] == pytest.approx({5: 0.03125})  # the run's last step
    rl = logged.runs["rl"]  # from the run's step when RL started (3), its iterations 1 and 2
    assert rl["reward/mean"] == pytest.approx({4: 0.1, 5: 0.2})
    assert rl[tracking.STAGE_STEP] == pytest.approx({4: 1, 5: 2})
    assert rl["update/response_length/max"] == pytest.approx({4: 7.0, 5: 7.0})
    assert "sampler/kl" not in rl  # NaN: not measured
    assert {"report.md", "pass_at_1.png"} <= {a.replace("-", ".") for a in logged.artifacts}


@pytest.mark.slow
def test_mlflow_ui_opens_a_runs_store(tmp_path, monkeypatch):
    """`mlflow ui` failed with "No module named 'flask'": the client (mlflow-skinny) has no UI,
    and the full mlflow wants an older pyarrow than the stack's. scripts/mlflow-ui.sh serves the
    UI from a virtualenv of its own (made once: minutes, from PyPI) over the run's store."""
    offline(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    with RunTracking(["mlflow"], run_dir, {"seed": 3}) as run:
        run.log_evaluation("base", "tiny", _evaluation(tmp_path / "e0", 0.25))
        with run.stage("rl"):
            tracking.log_stage_metrics({"reward/mean": 0.5}, 1)
            tracking.close_stage_runs()
    url = f"http://127.0.0.1:{free_port()}"
    script = Path(__file__).parents[1] / "scripts" / "mlflow-ui.sh"
    server = subprocess.Popen(
        ["bash", str(script), str(run_dir), "--port", url.rsplit(":", 1)[1], "--workers", "1"],
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: ask(f"{url}/health", 5).status == 200, timeout=900), url
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "<title>MLflow</title>" in page
        found = f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=codepost"
        experiment = json.load(urllib.request.urlopen(found, timeout=30))["experiment"]
        request = urllib.request.Request(
            f"{url}/api/2.0/mlflow/runs/search", method="POST",
            data=json.dumps({"experiment_ids": [experiment["experiment_id"]]}).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        runs = json.load(urllib.request.urlopen(request, timeout=30))["runs"]
        metrics = {(r["info"]["run_name"], m["key"], m["step"]): m["value"]
                   for r in runs for m in r["data"]["metrics"]}  # fmt: skip
        assert metrics[("run", "eval/tiny/greedy/pass_at_1", 0)] == 0.25
        assert metrics[("rl", "reward/mean", 1)] == 0.5
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(1, 1))
    figure.savefig(path)
    plt.close(figure)


@pytest.mark.parametrize(
    ("tracker", "variable"), [("mlflow", "MLFLOW_TRACKING_URI"), ("wandb", "WANDB_BASE_URL")]
)
@pytest.mark.parametrize("service", ["closed port", "silent listener"])
def test_a_tracker_service_that_does_not_answer_is_refused_in_seconds(
    tracker, variable, service, monkeypatch
):
    """MLflow's client retried for 15 minutes (5 at a closed port) before its first failure."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    endpoint = (
        contextlib.nullcontext(closed_port_url())
        if service == "closed port"
        else silent_listener_url()
    )
    with endpoint as url:
        monkeypatch.setenv(variable, url)
        started = time.monotonic()
        with pytest.raises(TrackerUnavailable, match=rf"^{variable}={url}.*: no answer"):
            TRACKERS[tracker].check()
        assert time.monotonic() - started < 30


def test_a_run_reporting_to_an_unreachable_tracker_exits_2_before_anything_starts(
    tmp_path, monkeypatch, capsys
):
    """`--report-to wandb` without a login ran the base evaluation, then failed in Prefect with
    exit 1 after 57 s, saying finished stages were kept (none was)."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no `wandb login`
    run_dir = tmp_path / "run"
    assert cli.main(["run", "--report-to", "wandb", "--run-dir", str(run_dir)]) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert "codepost run: a tracker is unavailable: WANDB_API_KEY is not set" in err
    with silent_listener_url() as url:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        started = time.monotonic()
        argv = ["run", "--report-to", "mlflow", "--run-dir", str(run_dir)]
        assert cli.main(argv) == EXIT_BAD_INPUT
        assert time.monotonic() - started < 30
    assert f"MLFLOW_TRACKING_URI={url}" in capsys.readouterr().err
    assert not run_dir.exists()
    monkeypatch.setenv("WANDB_MODE", "offline")  # on disk, to sync later: nothing to check
    TRACKERS["wandb"].check()


def test_a_resumed_run_leaves_one_tensorboard_point_per_step(tmp_path):
    """A resumed run logs its evaluations again, reused ones included: TensorBoard showed every
    point twice. A stage started over (a new config) logs its steps from the first again."""
    run_dir, stage_folder = tmp_path / "run", tmp_path / "run" / "tracking" / "tensorboard" / "rl"
    rl = made_checkpoint(tmp_path / "rl", steps=2)
    for attempt, passed in enumerate((0.25, 0.5)):
        with RunTracking(["tensorboard"], run_dir, {"seed": 1}) as run:
            run.log_evaluation("base", "tiny", _evaluation(tmp_path / f"b{attempt}", 0.125))
            with run.stage("rl"):
                for iteration in (1, 2):
                    tracking.log_stage_metrics({"reward/mean": passed + iteration}, iteration)
                tracking.close_stage_runs()
            run.made(rl)
            run.log_evaluation("rl", "tiny", _evaluation(tmp_path / f"r{attempt}", passed))
    points = tensorboard_points(
        run_dir / "tracking" / "tensorboard" / "run", "eval/tiny/greedy/pass_at_1"
    )
    assert points == [(0, 0.125), (2, 0.5)]
    assert tensorboard_points(stage_folder, "reward/mean") == [(1, 1.5), (2, 2.5)]
    with RunTracking(["tensorboard"], run_dir, {"seed": 1}) as run, run.stage("rl"):
        tracking.log_stage_metrics({"reward/mean": 9.0}, 3)  # a resumed stage: its next step
        tracking.close_stage_runs()
    assert tensorboard_points(stage_folder, "reward/mean") == [(1, 1.5), (2, 2.5), (3, 9.0)]


def test_a_trainers_logs_reach_the_stage_at_the_runs_step(tmp_path):
    """SFT logged at TRL's global step (1, 2, ...) while evaluations and RL counted the run's
    stages: one experiment, three meanings of step. A trainer's logs go on from the step the
    run was at when its stage started, under TRL's names, with the trainer's own step beside."""
    from codepost.pipeline.tracking.trainer import TrackedLogs

    run_dir = tmp_path / "run"
    with RunTracking(["tensorboard"], run_dir, {"seed": 1}) as run:
        run.made(made_checkpoint(tmp_path / "sft", steps=4))
        with run.stage("dpo"):
            callback = TrackedLogs()
            for global_step, loss in ((0, None), (1, 0.75), (2, 0.5)):  # exact in float32
                logs = {"eval_loss": 0.875} if loss is None else {"loss": loss, "grad_norm": 1.0}
                callback.on_log(None, SimpleNamespace(global_step=global_step), None, logs=logs)
            tracking.close_stage_runs()
    folder = run_dir / "tracking" / "tensorboard" / "dpo"
    assert tensorboard_points(folder, "train/loss") == [(5, 0.75), (6, 0.5)]
    assert tensorboard_points(folder, "eval/loss") == [(4, 0.875)]  # before training
    assert tensorboard_points(folder, tracking.STAGE_STEP) == [(4, 0.0), (5, 1.0), (6, 2.0)]


def test_a_tracker_failing_mid_run_is_named_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    """A store that fails mid-run (here MLflow's SQLite file, overwritten) killed the stage with
    a message naming no path: the run goes on with the other trackers, and says where."""
    offline(monkeypatch, tmp_path)
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    run_dir = tmp_path / "run"
    caplog.set_level(logging.ERROR, logger="codepost.pipeline.tracking")
    with RunTracking(["mlflow", "tensorboard"], run_dir, {"seed": 1}) as run:
        run.log_evaluation("base", "tiny", _evaluation(tmp_path / "e0", 0.25))
        with store.open("r+b") as database:
            database.write(b"not a database" * 512)
        run.made(made_checkpoint(tmp_path / "sft", steps=1))
        run.log_evaluation("sft", "tiny", _evaluation(tmp_path / "e1", 0.5))
        run.made(made_checkpoint(tmp_path / "rl", steps=1))
        run.log_evaluation("rl", "tiny", _evaluation(tmp_path / "e2", 0.75))
    [failure] = run.failures
    assert failure.startswith(f"mlflow failed, MLflow store sqlite:///{store}: ")
    assert "file is not a database" in failure
    assert f"MLflow store sqlite:///{store}" in caplog.text and "goes on without it" in caplog.text
    points = tensorboard_points(
        run_dir / "tracking" / "tensorboard" / "run", "eval/tiny/greedy/pass_at_1"
    )
    assert points == [(0, 0.25), (1, 0.5), (2, 0.75)]


@pytest.mark.slow
def test_a_full_wandb_folder_is_named_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    """W&B offline, its folder full: the run ended with exit 0 and no word."""
    offline(monkeypatch, tmp_path)
    full = tmp_path / "small-disk"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a small disk is a tmpfs, which needs root: {mounted.stderr.decode()}")
    try:
        monkeypatch.setenv("WANDB_DIR", str(full))
        caplog.set_level(logging.ERROR, logger="codepost.pipeline.tracking")
        run_dir = tmp_path / "run"
        with RunTracking(["wandb", "tensorboard"], run_dir, {"seed": 1}) as run:
            with run.stage("rl"):
                for iteration in range(1, 301):  # about 1 MiB of records into 256 KiB
                    metrics = {f"metric/{index:03d}/{'x' * 40}": iteration for index in range(50)}
                    tracking.log_stage_metrics(metrics, iteration)
                tracking.close_stage_runs()
            run.log_evaluation("base", "tiny", _evaluation(tmp_path / "e0", 0.25))
        stage_failure = f"wandb failed, W&B folder {full}/wandb/offline-run-"
        assert stage_failure in caplog.text and "stage rl goes on without it" in caplog.text
        assert "no space left on device" in caplog.text
        [failure] = run.failures  # the run's own records, on the same disk
        assert failure.startswith(stage_failure) and "disk is full (0 bytes free)" in failure
        assert "this run's records are incomplete" in caplog.text
        points = tensorboard_points(
            run_dir / "tracking" / "tensorboard" / "run", "eval/tiny/greedy/pass_at_1"
        )
        assert points == [(0, 0.25)]  # the other tracker had everything
    finally:
        subprocess.run(["umount", "--lazy", str(full)], check=True)
