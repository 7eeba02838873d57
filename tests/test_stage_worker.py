"""The stage worker: stages run in a process of their own whose output (and its children's)
reaches the caller line by line, whose errors come back as raised, and which takes everything
it started with it when a call is interrupted or the flow run's process is killed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from processes import gone, wait_until
from worker_functions import (
    draw_progress,
    fail,
    log_at_levels,
    report_progress,
    spawn_and_wait,
    speak,
)

from codepost.flows.stage_worker import StageWorker, in_stage_worker, line_level, stage_worker
from codepost.pipeline import progress


def test_output_of_the_worker_and_its_children_is_forwarded(tmp_path):
    lines: list[str] = []
    with stage_worker(tmp_path / "worker.log"):
        assert in_stage_worker(speak, "hello", forward=lines.append) == "HELLO"
        assert in_stage_worker(speak, "again", forward=lines.append) == "AGAIN"
    assert "worker says hello" in lines and "child says hello" in lines
    assert lines.count("worker says hello") == 1  # each line once, across calls
    assert "child says again" in lines
    assert "child says again" in (tmp_path / "worker.log").read_text()


def test_forwarded_lines_keep_the_level_they_were_logged_at(tmp_path):
    lines: list[str] = []
    with stage_worker(tmp_path / "worker.log"):
        in_stage_worker(log_at_levels, forward=lines.append)
    levels = {line: logging.getLevelName(line_level(line)) for line in lines}
    assert levels == {
        "WARNING codepost.test: careful": "WARNING",
        "(EngineCore pid=7) ERROR 11-23 22:01:14 [core.py:1] engine failed": "ERROR",
        "Processed prompts: 100%": "INFO",
    }


def test_a_progress_bar_shows_while_it_is_drawn_and_its_last_state_once_done(tmp_path, monkeypatch):
    monkeypatch.setattr("codepost.pipeline.output_lines.PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []
    with stage_worker(tmp_path / "worker.log"):
        in_stage_worker(draw_progress, 8, forward=lines.append)
    assert lines[-1] == "step 8/8"
    assert any(line.startswith("step ") and line != "step 8/8" for line in lines[:-1])


def test_progress_comes_back_as_events_and_each_call_gets_the_callers_environment(
    tmp_path, monkeypatch
):
    events: list[tuple] = []
    monkeypatch.setattr(progress, "_display", SimpleNamespace(handle=events.append))
    with stage_worker(tmp_path / "worker.log"):
        in_stage_worker(speak, "warm", forward=print)  # started before the variable is set
        monkeypatch.setenv("CODEPOST_TRACKING_STAGE", "rl")
        assert in_stage_worker(report_progress, 4, forward=print) == "rl"
    assert events[0][0] == "start" and events[0][2:5] == ("scoring", 4, 0)
    updates = [event[2] for event in events if event[0] == "update"]
    assert updates == sorted(updates) and updates[-1] == 4  # as it advanced, not all at once
    assert events[-1] == ("end", events[0][1])
    assert "scoring" not in (tmp_path / "worker.log").read_text()  # events, not output


def test_a_stage_error_is_raised_as_it_was_and_the_worker_goes_on(tmp_path):
    worker = StageWorker(tmp_path / "worker.log")
    try:
        with pytest.raises(ValueError, match="no such split"):
            worker.call(fail, "no such split", forward=lambda line: None)
        assert worker.call(speak, "still here", forward=lambda line: None) == "STILL HERE"
    finally:
        worker.stop()
    assert not worker.alive


def test_an_interrupted_call_kills_the_worker_and_its_children(tmp_path):
    pid_file = tmp_path / "pids"

    def cancel_once_started(line: str) -> None:  # as Prefect's cancellation arrives mid-stage
        if line == "child started":
            raise KeyboardInterrupt

    worker = StageWorker(tmp_path / "worker.log")
    with pytest.raises(KeyboardInterrupt):
        worker.call(spawn_and_wait, str(pid_file), forward=cancel_once_started)
    child, worker_pid = map(int, pid_file.read_text().split())
    assert wait_until(lambda: gone(child) and gone(worker_pid), 10)


def test_the_worker_dies_with_the_flow_run_process_even_on_sigkill(tmp_path):
    pid_file = tmp_path / "pids"
    tests = Path(__file__).parent
    parent = subprocess.Popen(
        [
            sys.executable,
            str(tests / "worker_functions.py"),
            str(tmp_path / "w.log"),
            str(pid_file),
        ],
        env={**os.environ, "PYTHONPATH": f"{tests}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    try:
        assert wait_until(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 60)
        child, worker_pid = map(int, pid_file.read_text().split())
        assert not gone(child) and not gone(worker_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: gone(child) and gone(worker_pid), 10)
    finally:
        if parent.poll() is None:
            parent.kill()
