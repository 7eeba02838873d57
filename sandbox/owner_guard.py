"""Sandbox containers removed when the process that owns them dies, however it dies.

A container keeps running after its pool's process is killed (a SIGKILLed stage worker, the
OOM killer): nothing in that process runs to remove it, and the next pool's clean-up of
orphans may be minutes away, or never come. So a process that starts a pool also starts one
small guard per Docker host, detached from it (no kill of the run's process group or process
tree reaches it: the launcher SIGKILLs every process under a rank). The guard polls its owner (by pid and start time, so a reused pid is not taken for
it), and once the owner is gone removes every container labelled with that owner on its host.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import psutil

POLL_S = 0.5
# Started by a short-lived parent that forks it and exits: its parent becomes init, so it is
# in no process tree of the run's.
_DETACHED = "import os, sys\nif os.fork() == 0:\n    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
_started: set[tuple[int, str]] = set()  # (owner pid, host) with a guard
_lock = threading.Lock()


def guard_containers(host: str | None, label: str, owner: str) -> None:
    """Start, once per process and Docker host, the guard that removes the containers whose
    ``label`` is ``owner`` when this process dies (``host`` None: the environment's engine)."""
    key = (os.getpid(), host or "")
    with _lock:
        if key in _started:
            return
        _started.add(key)
    started = repr(psutil.Process().create_time())
    # This file run as a script (-I: without its folder on the path), not imported through the
    # package: the package's imports (Docker's client among them) took 0.34 s of CPU at the
    # start of every pool, against 0.07 s for the guard's whole start now.
    guard = ["-I", __file__, str(os.getpid()), started, label, owner, host or ""]
    subprocess.run(
        [sys.executable, "-S", "-c", _DETACHED, *guard],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        check=True,
    )


def _alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):  # gone, or a zombie no one has reaped yet
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def _guard(pid: str, started: str, label: str, owner: str, host: str) -> None:
    try:
        process = psutil.Process(int(pid))
        if process.create_time() != float(started):
            return  # a new process has its pid (and label): the next pool's clean-up decides
    except psutil.NoSuchProcess:
        process = None
    while process is not None and _alive(process):
        time.sleep(POLL_S)
    import docker  # not before it is needed: a guard spends its life waiting

    with contextlib.suppress(docker.errors.DockerException):  # an engine gone has none left
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        for container in client.containers.list(
            all=True, filters={"label": f"{label}={owner}"}, ignore_removed=True
        ):
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)


if __name__ == "__main__":
    _guard(*sys.argv[1:])
