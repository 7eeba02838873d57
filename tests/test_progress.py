"""Progress as a person reads it: lines at a bounded rate with what is left, the run's numbered
steps with an estimate, and what a terminal of each verbosity shows."""

from __future__ import annotations

import io
import logging
import time

import pytest

from codepost.flows.terminal import ConsoleFilter
from codepost.pipeline import progress
from codepost.pipeline.progress import Lines, RunSteps, duration, track


@pytest.fixture
def clock(monkeypatch):
    """The progress clock, moved by hand (``clock[0] += seconds``): what a task shows does not
    depend on how long a sleep takes on a busy machine. It starts at the real reading, which
    a task takes for its start."""
    now = [time.monotonic()]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def test_a_task_shows_as_lines_at_a_bounded_rate_and_once_when_it_ends(caplog, clock):
    lines = Lines(every_s=0.2)
    with (
        caplog.at_level(logging.INFO, "codepost.progress"),
        progress.displayed_by(lines),
        track("sampling", 40) as task,
    ):
        for _ in range(40):
            clock[0] += 0.02  # 0.8 s: a line at most every 0.2 s
            task.advance()
    shown = [r.getMessage() for r in caplog.records]
    assert 2 <= len(shown) <= 5, shown
    assert all(getattr(r, "progress", False) for r in caplog.records)
    assert shown[0].startswith("sampling: ") and shown[0].endswith(" left")  # 12/40 (30%), ...
    assert shown[-1].startswith("sampling: 40/40 in ")


def test_what_is_left_is_told_from_the_rate_after_the_first_item(caplog, clock):
    """A first item that carries the start-up (1 s here, an engine's warm-up in a run) says
    nothing of the rate: no estimate until 5% more are done, then one from the items since."""
    lines = Lines(every_s=0)
    with (
        caplog.at_level(logging.INFO, "codepost.progress"),
        progress.displayed_by(lines),
        track("sampling", 100) as task,
    ):
        clock[0] += 1.0
        task.advance()
        for _ in range(20):
            clock[0] += 0.01
            task.advance()
    shown = [r.getMessage() for r in caplog.records]
    estimates = [line for line in shown if line.endswith(" left")]
    assert not any(" left" in line for line in shown[:5]), shown  # 1..5 done: none yet
    assert estimates, shown
    # From the rate since the first item, 79 x 10 ms; from the start it would be 79 x 57 ms.
    assert estimates[-1].endswith(", about 1s left"), estimates


def test_a_task_forwarded_from_another_process_ends_at_its_last_count(caplog):
    """Updates are forwarded at a bounded rate; the ones held back must not leave the end at
    an earlier count (vLLM's bar of 164 prompts ended "sampling: 157/164 in 3m 18s")."""
    with caplog.at_level(logging.INFO, "codepost.progress"):
        forward = progress.Forward(Lines(every_s=60).handle, every_s=60)
        with progress.displayed_by(forward), track("sampling", 164) as task:
            for _ in range(164):
                task.advance()
    assert [r.getMessage()[:26] for r in caplog.records] == ["sampling: 164/164 in 0s"]


def test_the_run_steps_say_where_the_run_is_and_what_is_left(caplog, monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 10))  # every reading 10 s later
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    steps = RunSteps(["base/he", "sft", "sft/he", "rl", "rl/he"], lambda s: "/" in s)
    with caplog.at_level(logging.INFO, "codepost.progress"):
        for label in ("base/he", "sft"):
            with steps.step(label):
                pass
        steps.skip("rl/he")
        with steps.step("sft/he"):
            pass
    shown = [r.getMessage() for r in caplog.records if not getattr(r, "progress", False)]
    assert shown[0] == "[1/5] base/he: started (run 10s)"
    assert shown[1].startswith("[1/5] base/he: done in ")
    # after an evaluation and a stage: one evaluation and one stage to come
    assert shown[-2].startswith("[3/4] sft/he: started (run ")
    assert shown[-2].endswith(" left)")


def test_a_resumed_run_estimates_from_computed_steps_only(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    steps = RunSteps(["sft", "sft/he", "rl", "rl/he"], lambda s: "/" in s)
    for label in ("sft", "sft/he"):
        with steps.step(label):
            now[0] += 0.5
    assert steps.left() is None  # reused in half a second each: nothing to estimate from
    with steps.step("rl"):
        now[0] += 300.0
    assert steps.left() == 300.0  # rl/he, at the only computed step's pace


def test_duration_reads_as_a_person_writes_it():
    assert [duration(s) for s in (9, 252, 3720)] == ["9s", "4m 12s", "1h 02m"]


@pytest.mark.parametrize(
    ("verbosity", "bars", "shown"),
    [
        ("normal", True, {"own", "forwarded own", "library warning"}),
        ("normal", False, {"own", "forwarded own", "library warning", "progress"}),
        ("quiet", False, {"library warning"}),
        (
            "verbose",
            True,
            {"own", "forwarded own", "library warning", "library info", "expected engine notice"},
        ),
    ],
)
def test_what_a_terminal_shows(verbosity, bars, shown):
    records = {
        "own": logging.makeLogRecord({"name": "codepost.run", "levelno": logging.INFO}),
        "forwarded own": logging.makeLogRecord(
            {"name": "prefect.task_runs", "levelno": logging.INFO, "codepost": True}
        ),
        "library info": logging.makeLogRecord({"name": "vllm", "levelno": logging.INFO}),
        "library warning": logging.makeLogRecord({"name": "vllm", "levelno": logging.WARNING}),
        "expected engine notice": logging.makeLogRecord(
            {
                "name": "prefect.task_runs",
                "levelno": logging.WARNING,
                "msg": "(EngineCore pid=7) WARNING 11-27 15:40:47 [ompmultiprocessing.py:63] "
                "VLLM_CPU_NUM_OF_RESERVED_CPU is less than the minimum requirement: 1 cores",
            }
        ),
        "progress": logging.makeLogRecord(
            {"name": "codepost.progress", "levelno": logging.INFO, "progress": True}
        ),
    }
    console = ConsoleFilter(verbosity, bars)
    assert {name for name, record in records.items() if console.filter(record)} == shown


def test_a_terminal_draws_live_bars_even_on_a_console_without_richs_styles():
    from rich.console import Console
    from rich.theme import Theme

    screen = io.StringIO()  # a terminal whose theme has none of rich's own styles (Prefect's)
    console = Console(file=screen, force_terminal=True, width=100, theme=Theme(inherit=False))
    with progress.shown_on(console), track("scoring greedy", 48) as task:
        task.advance(32)
        time.sleep(0.3)  # the bars redraw on their own
    assert "scoring greedy" in screen.getvalue() and "32/48" in screen.getvalue()


def test_a_console_that_is_not_a_terminal_gets_lines(caplog):
    from rich.console import Console

    with (
        caplog.at_level(logging.INFO, "codepost.progress"),
        progress.shown_on(Console(file=io.StringIO())),
        track("sampling", 2) as task,
    ):
        task.advance(2)
    assert [r.getMessage() for r in caplog.records][-1].startswith("sampling: 2/2 in ")
