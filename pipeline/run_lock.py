"""One run per run folder: a second run on a folder in use is refused at once, naming the
process that holds it. The lock is an ``flock`` on ``<run_dir>/.lock``: the kernel releases it
when its process dies, however it dies, so a lock left by a dead run is simply taken over."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"


class RunFolderLocked(RuntimeError):
    """Another live process is running on this run folder."""


@contextlib.contextmanager
def run_folder_lock(run_dir: Path) -> Iterator[None]:
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "another process"
            raise RunFolderLocked(
                f"{run_dir} is in use by {holder}: wait for that run to end, or choose another "
                "run_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock
