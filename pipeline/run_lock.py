"""One run per run folder: a second run on a folder in use is refused at once, naming the
process that holds it. The lock is an ``flock`` on ``<run_dir>/.lock``: the kernel releases it
when its process dies, however it dies, so a lock left by a dead run is simply taken over. The
run that takes it removes what a killed run was still writing (:func:`remove_stale_staging`).

``codepost run`` takes it before anything starts and holds it for the run it starts, which then
does not take it again: two commands started in the same instant cannot both pass a check
and then race for the lock (one runs, the other is refused)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from .atomic import remove_stale_staging

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"
# run folders whose lock a caller holds for the runs it starts (in this context)
_held_for_inner_runs: ContextVar[frozenset[Path]] = ContextVar(
    "held_run_folders", default=frozenset()
)


class RunFolderLocked(RuntimeError):
    """Another live process is running on this run folder, or its lock cannot be taken."""


@contextlib.contextmanager
def run_folder_lock(
    run_dir: Path,
    *,
    for_inner_runs: bool = False,
    held_by_another: str = "wait for that run to end, or choose another run_dir",
) -> Iterator[None]:
    """``for_inner_runs``: the runs started inside use this lock instead of taking it again;
    ``held_by_another``: what the refusal tells the user to do."""
    held = Path(run_dir).resolve()
    if held in _held_for_inner_runs.get():
        yield
        return
    path = Path(run_dir) / LOCK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    except OSError as exc:  # a directory, an immutable file, a read-only folder
        raise RunFolderLocked(
            f"cannot take the run folder's lock {path}: {exc.strerror}; it must be a file this "
            "user can write (remove it, or choose another run_dir)"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "another process"
            raise RunFolderLocked(f"{run_dir} is in use by {holder}: {held_by_another}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        for stale in remove_stale_staging(Path(run_dir)):
            log.info("removed %s: a killed run was writing it", stale)
        inner = (
            _held_for_inner_runs.set(_held_for_inner_runs.get() | {held})
            if for_inner_runs
            else None
        )
        try:
            yield
        finally:
            if inner is not None:
                _held_for_inner_runs.reset(inner)
    finally:
        os.close(fd)  # releases the lock
