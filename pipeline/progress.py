"""Progress a person can follow, produced here and shown however the process's owner chooses.

Work reports progress as tasks (:func:`track`: a description, a total, advanced as it goes;
:func:`tqdm_class` turns a library's tqdm bar into one), and the run loop as numbered steps
(:class:`RunSteps`: ``[3/8] rl: started`` and ``done in 4m 12s``, with the run's elapsed time
and an estimate of what is left). How tasks show is the process's *display*, set once by
whoever owns the output (:func:`set_display`):

* :class:`Lines` (the default): one log line per task every :data:`EVERY_S` seconds at most,
  and one when it ends, on the ``codepost.progress`` logger: what a log file, a pipe, or
  Prefect's task logs show;
* :class:`Bars`: live rich bars on a terminal;
* :class:`Forward`: the events handed to another process, which shows them with its display
  (the stage worker sends them to the flow run, :func:`handle` takes them there).

Every line is logged with ``extra={"progress": True}``, so a terminal that shows bars can
leave the same lines out of its console and still send them to a log.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.default_styles import DEFAULT_STYLES
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.theme import Theme
from tqdm import tqdm

log = logging.getLogger("codepost.progress")

EVERY_S = 10.0  # a task's log line at most this often
# A line says what is left once this share of the task is done after its first item: the
# first item carries the start-up (an engine's warm-up, a whole batch's prefill), and a rate
# from a few items said "about 7h 07m left" for a 20-minute task.
MEASURED_SHARE = 0.05
SKIP_S = 2.0  # a run step shorter than this was reused, not computed: no estimate from it

# ("start", id, description, total, completed, lines) | ("update", id, completed) | ("end", id);
# lines: whether Lines shows the task (the run's own bar is its steps' lines already)
Event = tuple[Any, ...]


class Display(Protocol):
    def handle(self, event: Event) -> None: ...


def duration(seconds: float) -> str:
    """``1h 02m``, ``4m 12s``, ``9s``."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds}s"


@dataclass
class _State:
    description: str
    total: int | None
    completed: int
    started: float = field(default_factory=time.monotonic)
    shown: float = field(default_factory=time.monotonic)
    first: tuple[float, int] | None = None  # when the first items were done, and how many

    def left(self, now: float) -> float | None:
        """Seconds left at the rate since the first items were done; None until enough of the
        task has been done since then to tell."""
        if not self.total or self.first is None:
            return None
        since, first_count = self.first
        measured = self.completed - first_count
        if measured < max(1, MEASURED_SHARE * self.total):
            return None
        return (now - since) / measured * (self.total - self.completed)


class Lines:
    """Tasks as log lines: ``sampling: 64/164 (39%), 1m 12s, about 1m 50s left``, every
    ``every_s`` at most while a task runs (nothing is held back to its end), and its last
    state when it ends. Only the first rank of a launch logs."""

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = EVERY_S if every_s is None else every_s
        self.tasks: dict[str, _State] = {}
        self.silent = os.environ.get("RANK", "0") != "0"

    def handle(self, event: Event) -> None:
        kind, task = event[0], event[1]
        if kind == "start":
            if event[5]:
                self.tasks[task] = _State(event[2], event[3], event[4])
            return
        state = self.tasks.get(task)
        if state is None:
            return
        now = time.monotonic()
        if kind == "update":
            state.completed = event[2]
            if state.first is None and state.completed > 0:
                state.first = (now, state.completed)
            if now - state.shown >= self.every_s:
                state.shown = now
                self._line(state, now)
        elif kind == "end":
            del self.tasks[task]
            self._line(state, now, ended=True)

    def _line(self, state: _State, now: float, ended: bool = False) -> None:
        if self.silent:
            return
        elapsed = now - state.started
        done = f"{state.completed}" if state.total is None else f"{state.completed}/{state.total}"
        if ended:
            text = f"{state.description}: {done} in {duration(elapsed)}"
        else:
            text = f"{state.description}: {done}"
            if state.total:
                text += f" ({100 * state.completed // state.total}%)"
            text += f", {duration(elapsed)}"
            left = state.left(now)
            if left is not None:
                text += f", about {duration(left)} left"
        log.info(text, extra={"progress": True})


class Bars:
    """Tasks as live rich bars on ``console`` (a terminal); :meth:`live` shows them."""

    def __init__(self, console: Any) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, Any] = {}

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        # The bars' styles, on a console whose theme has none of rich's own (Prefect's)
        console = self.progress.console
        console.push_theme(Theme({k: v for k, v in DEFAULT_STYLES.items()
                                  if k.startswith(("bar.", "progress."))}))  # fmt: skip
        try:
            with self.progress:
                yield
        finally:
            console.pop_theme()

    def handle(self, event: Event) -> None:
        kind, task = event[0], event[1]
        if kind == "start":
            self.tasks[task] = self.progress.add_task(event[2], total=event[3], completed=event[4])
        elif task in self.tasks:
            if kind == "update":
                self.progress.update(self.tasks[task], completed=event[2])
            else:
                self.progress.remove_task(self.tasks.pop(task))


class Both:
    """Every event to each display (bars on the terminal and lines for the logs)."""

    def __init__(self, *displays: Display) -> None:
        self.displays = displays

    def handle(self, event: Event) -> None:
        for display in self.displays:
            display.handle(event)


class Forward:
    """Events handed to ``send`` (to another process), an update at most every ``every_s``
    per task: a bar needs no more, and the channel stays light."""

    def __init__(self, send: Callable[[Event], None], every_s: float = 0.25) -> None:
        self.send, self.every_s = send, every_s
        self.sent: dict[str, float] = {}
        self.held: dict[str, Event] = {}  # each task's last update not sent yet
        self.lock = threading.Lock()

    def handle(self, event: Event) -> None:
        now = time.monotonic()
        kind, task = event[0], event[1]
        with self.lock:
            if kind == "update" and now - self.sent.get(task, 0.0) < self.every_s:
                self.held[task] = event
                return
            self.sent[task] = now
            if kind == "end":
                del self.sent[task]
                if task in self.held:  # the task ends at its last count, not an earlier one
                    self.send(self.held[task])
            self.held.pop(task, None)
            self.send(event)


_display: Display = Lines()
_ids = itertools.count()


def set_display(display: Display) -> Display:
    """Show this process's progress with ``display``; returns the one it replaces."""
    global _display
    previous, _display = _display, display
    return previous


@contextlib.contextmanager
def displayed_by(display: Display) -> Iterator[None]:
    previous = set_display(display)
    try:
        yield
    finally:
        set_display(previous)


@contextlib.contextmanager
def shown_on(console: Any | None, lines: bool = False) -> Iterator[None]:
    """Inside the block, tasks show as live bars on ``console`` when it is a terminal, and as
    lines when ``lines`` or when there are no bars."""
    bars = Bars(console) if console is not None and console.is_terminal else None
    shown: list[Display] = [bars] if bars is not None else []
    if lines or bars is None:
        shown.append(Lines())
    with (
        displayed_by(shown[0] if len(shown) == 1 else Both(*shown)),
        bars.live() if bars is not None else contextlib.nullcontext(),
    ):
        yield


def handle(event: Event) -> None:
    """Show an event (one forwarded from another process) with this process's display."""
    _display.handle(event)


class Task:
    """A unit of work with a total (None: unknown), as it advances."""

    def __init__(
        self, description: str, total: int | None, completed: int = 0, lines: bool = True
    ) -> None:
        self.id = f"{os.getpid()}-{next(_ids)}"  # unique across the processes of a run
        self.completed = completed
        handle(("start", self.id, description, total, completed, lines))

    def advance(self, n: int = 1) -> None:
        self.update(self.completed + n)

    def update(self, completed: int) -> None:
        self.completed = completed
        handle(("update", self.id, completed))

    def end(self) -> None:
        handle(("end", self.id))


@contextlib.contextmanager
def track(
    description: str, total: int | None, completed: int = 0, lines: bool = True
) -> Iterator[Task]:
    """A task shown while the block runs: ``with track("scoring", len(rows)) as task: ...
    task.advance()``."""
    task = Task(description, total, completed, lines)
    try:
        yield task
    finally:
        task.end()


def tqdm_class(description: str) -> type:
    """A tqdm class for a library that takes one (vLLM's ``use_tqdm``): its bars draw nothing,
    and one advanced by hand (not iterating) reports as a task named ``description``."""

    class Reporting(tqdm):  # type: ignore[misc]
        task: Task | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.sink = open(os.devnull, "w")  # noqa: SIM115 (closed with the bar)
            super().__init__(*args, **{**kwargs, "file": self.sink, "disable": False})
            if not args and kwargs.get("iterable") is None:
                self.task = Task(description, kwargs.get("total"))

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.task is not None:
                self.task.update(int(self.n))
            return shown

        def close(self) -> None:
            if self.task is not None:
                self.task.end()
                self.task = None
            super().close()
            self.sink.close()

    return Reporting


class RunSteps:
    """The steps of a run (each stage and each evaluation, in order) as numbered lines, with
    the run's elapsed time and an estimate of what is left: each step still to come is
    expected to take as long as the finished steps of its kind took on average (evaluations
    apart from stages; a reused step, done in under :data:`SKIP_S`, counts for nothing, so a
    resumed run gives no estimate until it has computed a step)."""

    def __init__(self, steps: list[str], is_evaluation: Callable[[str], bool]) -> None:
        self.steps, self.is_evaluation = list(steps), is_evaluation
        self.took: dict[str, float] = {}
        self.started = time.monotonic()

    def left(self) -> float | None:
        """Seconds the steps still to come should take (None before a step was computed)."""
        computed = {s: t for s, t in self.took.items() if t >= SKIP_S}
        if not computed:
            return None
        overall = sum(computed.values()) / len(computed)

        def mean(evaluation: bool) -> float:
            same = [t for s, t in computed.items() if self.is_evaluation(s) == evaluation]
            return sum(same) / len(same) if same else overall

        estimates = {True: mean(True), False: mean(False)}
        return sum(estimates[self.is_evaluation(s)] for s in self.steps if s not in self.took)

    def _status(self) -> str:
        left = self.left()
        elapsed = duration(time.monotonic() - self.started)
        return f"run {elapsed}" + ("" if left is None else f", about {duration(left)} left")

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """``[i/n] label: started ...``, the block (a bar of the run's steps), then
        ``[i/n] label: done in ...``."""
        number = f"[{self.steps.index(label) + 1}/{len(self.steps)}] {label}"
        log.info("%s: started (%s)", number, self._status())
        left = self.left()
        description = number + ("" if left is None else f" (about {duration(left)} left)")
        started = time.monotonic()
        with track(description, len(self.steps), len(self.took), lines=False):
            yield
        self.took[label] = time.monotonic() - started
        log.info("%s: done in %s (%s)", number, duration(self.took[label]), self._status())

    def skip(self, label: str) -> None:
        """A step that will not run (an evaluation of a stage that trained nothing)."""
        self.steps.remove(label)
