"""Prefect's ephemeral API server for ``codepost run``, stopped with the run's process even when
that process is killed with SIGKILL: Prefect stops the server at a normal exit only, and a
killed run would leave it serving (and holding its database) for good.

A small guard process, told by the kernel when the run's process dies (``PR_SET_PDEATHSIG``),
stops the server then; it checks the server's start time, so it never stops a process that
took over a reused pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from .stage_worker import signal_on_parent_death


def start_ephemeral_server() -> None:
    """Start the ephemeral server Prefect's client would start on first use (the same instance)
    and a guard that stops it when this process dies, however it dies. Nothing to do when
    ``PREFECT_API_URL`` names a server."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    server = SubprocessASGIServer()
    server.start()
    assert server.server_process is not None  # start() sets it
    pid = server.server_process.pid
    if sys.platform.startswith("linux"):
        subprocess.Popen(
            [sys.executable, "-m", __name__, str(pid),
             repr(psutil.Process(pid).create_time()), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the run reaches the run, not the guard
        )  # fmt: skip


def _guard(server_pid: int, server_started: float, run_pid: int) -> None:
    """Wait for the run's process to die, then stop the server if it is still the same one."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal_on_parent_death(signal.SIGTERM)
    if os.getppid() == run_pid:  # else the run died before prctl took effect
        signal.sigwait({signal.SIGTERM})
    try:
        server = psutil.Process(server_pid)
        if server.create_time() == server_started:
            server.terminate()
            try:
                server.wait(10)
            except psutil.TimeoutExpired:
                server.kill()
    except psutil.NoSuchProcess:
        pass  # the run ended normally and Prefect stopped its server


if __name__ == "__main__":
    _guard(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
