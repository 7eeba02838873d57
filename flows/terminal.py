"""What ``codepost run`` shows on its terminal, and where the rest goes.

* normal: codepost's own lines (each step of the run, each stage's summary), every library's
  warnings and errors but the notices vLLM's engine prints on every start because of the
  settings codepost chose (``EXPECTED_ENGINE_WARNINGS``), and live progress bars when stderr is
  a terminal (else the progress lines, every 10 s at most);
* ``--quiet``: warnings, errors and the result;
* ``--verbose``: every line, libraries' INFO lines and those notices too (vLLM's engine
  settings, Prefect's task states).

Whatever the terminal shows, ``<run>/logs/run.log`` gets this process's lines (INFO and up),
``<run>/logs/stage-worker.log`` everything the stage worker and its children print, and
Prefect's task logs codepost's lines and the progress lines (every 10 s at most).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from prefect.logging.handlers import PrefectConsoleHandler

from ..pipeline import progress
from ..pipeline.inference.sampling import EXPECTED_ENGINE_WARNINGS

Verbosity = Literal["quiet", "normal", "verbose"]
RUN_LOG = "run.log"


class ConsoleFilter(logging.Filter):
    """The lines a terminal of ``verbosity`` shows (``bars``: it shows live bars, so not the
    progress lines that say the same)."""

    def __init__(self, verbosity: Verbosity, bars: bool) -> None:
        super().__init__()
        self.verbosity, self.bars = verbosity, bars

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return self.verbosity == "verbose" or not _expected(record)
        if self.verbosity == "quiet":
            return False
        if getattr(record, "progress", False):
            return not self.bars
        own = record.name.startswith("codepost") or getattr(record, "codepost", False)
        return own or self.verbosity == "verbose"


def _expected(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
        return False
    message = record.getMessage()
    return any(notice in message for notice in EXPECTED_ENGINE_WARNINGS)


@contextlib.contextmanager
def terminal(run_dir: Path, verbosity: Verbosity) -> Iterator[None]:
    """Inside this block, this process's logs and progress show as ``verbosity`` says."""
    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    bars = verbosity != "quiet" and any(h.console.is_terminal for h in consoles)
    shown = ConsoleFilter(verbosity, bars)
    log_file = Path(run_dir) / "logs" / RUN_LOG
    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    for handler in consoles:
        handler.addFilter(shown)
    root.addHandler(to_file)
    # on the console Prefect logs to: its lines print above the bars
    tty = next((h.console for h in consoles if h.console.is_terminal), None)
    try:
        with progress.shown_on(tty if bars else None, lines=True):
            yield
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler in consoles:
            handler.removeFilter(shown)
