"""Experiment trackers, each for real and offline: a run's parameters, evaluations and artifacts
from the run side, and a stage's metrics from another process (as the stage worker logs them),
read back with each tracker's own reader (tests/tracker_readers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracker_readers import offline, read

from codepost.pipeline import tracking
from codepost.pipeline.tracking import TRACKERS, RunTracking, evaluation_metrics

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
    # (TRL imports wandb itself when it is installed: only codepost's side is checked here.)
    code = STAGE_SIDE.replace("tracking.close", "tracking.trainer_arguments()\ntracking.close")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, tracking.STAGE_ENV: "rl"})  # fmt: skip
    assert "imported: []" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("tracker", sorted(TRACKERS))
def test_a_run_and_a_stage_in_another_process_reach_the_tracker(tracker, tmp_path, monkeypatch):
    offline(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    config = {"seed": 3, "stages": [{"stage": "rl", "config": {"iterations": 2}}]}
    with RunTracking([tracker], run_dir, config) as run:
        run.log_evaluation("base", "tiny", _evaluation(tmp_path / "e0", 0.25))
        with tracking.stage("rl"):  # as the stage worker gets it: the caller's environment
            subprocess.run([sys.executable, "-c", STAGE_SIDE], check=True, env=dict(os.environ))
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
    assert logged.runs["run"]["eval/tiny/greedy/pass_at_1"] == pytest.approx({0: 0.25, 1: 0.5})
    assert logged.runs["run"]["eval/tiny/greedy/pass_at_1_ci95_high"] == pytest.approx(
        {0: 0.9, 1: 0.9}
    )
    assert logged.runs["run"]["gate/p_value"] == pytest.approx({1: 0.03125})  # the last model
    rl = logged.runs["rl"]
    assert rl["reward/mean"] == pytest.approx({1: 0.1, 2: 0.2})
    assert rl["update/response_length/max"] == pytest.approx({1: 7.0, 2: 7.0})
    assert "sampler/kl" not in rl  # NaN: not measured
    assert {"report.md", "pass_at_1.png"} <= {a.replace("-", ".") for a in logged.artifacts}


def _png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(1, 1))
    figure.savefig(path)
    plt.close(figure)
