"""Accelerator-bound stages run in a worker process of the flow run, kept across its stages so
the sampling engine stays warm between them, in a session of its own.

Everything the worker and its children (the vLLM engine's processes) write goes to a log file
that is forwarded line by line to the task run's logs; the stages' progress comes back as
events (:mod:`codepost.pipeline.progress`) and shows with the caller's display. Each call
runs with the caller's ``CODEPOST_*`` environment variables (the run's trackers and stage). Stopping the worker (the run ends, is
cancelled, times out or is interrupted) kills its whole process group; the worker also dies with
the flow run's process, even one killed with SIGKILL. The worker closes its sandbox pool
when it ends; the containers of a killed one are removed by the pool's guard
(:mod:`codepost.sandbox.owner_guard`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from ..pipeline import progress
from ..pipeline.output_lines import OutputLines
from ..pipeline.resources import close_all

ENV_PREFIX = "CODEPOST_"
_PR_SET_PDEATHSIG = 1


class StageWorkerDied(RuntimeError):
    """The worker process ended while running a stage (killed, out of memory, crashed)."""


def _kill_own_group(signum: int, frame: Any) -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def signal_on_parent_death(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies, even by SIGKILL
    (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signum)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _serve(connection: Connection, parent_pid: int) -> None:
    """The worker's loop: run ``(function, args)`` requests until the connection closes."""
    signal_on_parent_death(signal.SIGTERM)  # die with the flow run
    if os.getppid() != parent_pid:  # the flow run died before prctl took effect
        return
    signal.signal(signal.SIGTERM, _kill_own_group)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sending = threading.Lock()

    def send(message: tuple[str, Any]) -> None:
        with sending:
            connection.send(message)

    progress.set_display(progress.Forward(lambda event: send(("progress", event))))
    try:
        while True:
            try:
                function, args, environment = connection.recv()
            except EOFError:
                return
            for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
                del os.environ[name]
            os.environ.update(environment)
            try:
                reply = ("ok", function(*args))
            except Exception as exc:
                logging.getLogger("codepost").exception("%s failed", function.__name__)
                reply = ("error", _picklable(exc))
            send(reply)
    finally:  # close what the stages opened: the engines and the sandbox containers
        close_all()


class StageWorker:
    """One worker process: :meth:`call` runs a function there, :meth:`stop` ends it."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._connection, child = multiprocessing.Pipe()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(child.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=[child.fileno()],
                start_new_session=True,  # its own process group: the engine's processes join it
                # this process's import path, as multiprocessing gives its children
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
                    "PYTHONUNBUFFERED": "1",
                },
            )
        child.close()
        self._lock = threading.Lock()
        self._lines = OutputLines()
        atexit.register(self.stop)

    def call(self, function: Callable[..., Any], *args: Any, forward: Callable[[str], None]):
        """``function(*args)`` in the worker, its output passed to ``forward`` line by line.
        Interrupted (cancelled, timed out), it stops the worker before re-raising."""
        with self._lock:
            try:
                try:
                    environment = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
                    self._connection.send((function, args, environment))
                    status, value = self._reply(forward)
                except (EOFError, OSError) as exc:
                    raise StageWorkerDied(
                        f"the stage worker ended (exit code {self._wait(5)}) while running "
                        f"{function.__name__}; its output: {self.log_path}"
                    ) from exc
            except BaseException:
                self.stop(graceful=False)
                raise
            finally:
                self._forward(forward)
        if status == "error":
            raise value
        return value

    def _reply(self, forward: Callable[[str], None]) -> tuple[str, Any]:
        """The call's reply; meanwhile its progress events shown here and its output
        forwarded (at least every half second)."""
        while True:
            shown = time.monotonic()
            while self._connection.poll(0.5):
                status, value = self._connection.recv()
                if status != "progress":
                    return status, value
                progress.handle(value)
                if time.monotonic() - shown > 0.5:
                    break
            self._forward(forward)
            if not self.alive and not self._connection.poll():
                raise EOFError

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _wait(self, timeout: float) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

    def _forward(self, forward: Callable[[str], None]) -> None:
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
            self._offset += len(data)
            for line in self._lines.feed(data):
                forward(line)

    def stop(self, graceful: bool = True) -> None:
        """End the worker and everything it started: let it close its engine and sandboxes
        when ``graceful``, then kill whatever of its process group is left."""
        atexit.unregister(self.stop)
        if graceful and self.alive:
            self._connection.close()
            self._wait(60)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._wait(10)
        self._connection.close()


class _Scope:
    """The stage worker of the current flow run, started on first use and again after a stop."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.worker: StageWorker | None = None

    def get(self) -> StageWorker:
        if self.worker is None or not self.worker.alive:
            self.worker = StageWorker(self.log_path)
        return self.worker


_scope: _Scope | None = None


@contextlib.contextmanager
def stage_worker(log_path: Path) -> Iterator[None]:
    """Stages run by :func:`in_stage_worker` inside this block share one worker process, which
    is stopped on the way out, however the block ends."""
    global _scope
    outer, _scope = _scope, _Scope(Path(log_path))
    try:
        yield
    finally:
        scope, _scope = _scope, outer
        if scope.worker is not None:
            scope.worker.stop()


def stop_stage_worker() -> None:
    """Stop the current flow run's stage worker, if one runs, freeing what it holds (its
    engine, the accelerator's memory); the next stage it runs starts a new one."""
    if _scope is not None and _scope.worker is not None:
        _scope.worker.stop()


# The worker logs "LEVEL name: message"; vLLM's processes "(EngineCore pid=7) LEVEL 11-23 ...".
_LEVEL_AT_START = re.compile(r"(?:\(\w+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


# ... and a launched stage's ranks "INFO [rank 0] codepost.stages.rl: ...".
_OWN = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\[rank \d+\] )?codepost[.:]")


def is_own(line: str) -> bool:
    """Whether a forwarded line was logged by codepost (not by a library it runs)."""
    return _OWN.match(line) is not None


def line_level(line: str) -> int:
    """The logging level a forwarded line was logged at; INFO for raw output (progress bars)."""
    match = _LEVEL_AT_START.match(line)
    return cast(int, logging.getLevelName(match[1])) if match else logging.INFO  # a level name


def in_stage_worker(
    function: Callable[..., Any], *args: Any, forward: Callable[[str], None]
) -> Any:
    """``function(*args)`` in the current flow run's stage worker."""
    if _scope is None:
        raise RuntimeError(f"{function.__name__}: no stage worker; run it inside stage_worker()")
    return _scope.get().call(function, *args, forward=forward)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
