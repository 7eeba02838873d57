"""Prefect's ephemeral API server for ``codepost run``, stopped with the run's process even when
that process is killed with SIGKILL: Prefect stops the server at a normal exit only, and a
killed run would leave it serving (and holding its database) for good.

A small guard process, told by the kernel when the run's process dies (``PR_SET_PDEATHSIG``),
stops the server then; it checks the server's start time, so it never stops a process that
took over a reused pid.

Its first start on a fresh ``PREFECT_HOME`` creates and migrates a SQLite database and imports
the whole server cold: on a fresh or busy 2-core machine that took longer than the 20 s Prefect
waits by default, and the run died before its first stage. :data:`STARTUP_TIMEOUT_S` is the
default of Prefect's own setting for that wait (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``,
which a user's value overrides): it covers every way the first start is slow (a new home, a
cold page cache, a loaded CPU), where preparing the database during set-up would cover only
the first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from .stage_worker import signal_on_parent_death

STARTUP_TIMEOUT_S = 300
TIMEOUT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


class EphemeralServerError(RuntimeError):
    """Prefect's ephemeral API server did not start; the message names the cause and the fix."""


def allow_a_slow_first_start() -> None:
    """Before Prefect's settings load: give the server's first start the time it needs."""
    os.environ.setdefault(TIMEOUT_SETTING, str(STARTUP_TIMEOUT_S))


def start_ephemeral_server() -> None:
    """Start the ephemeral server Prefect's client would start on first use (the same instance)
    and a guard that stops it when this process dies, however it dies. Nothing to do when
    ``PREFECT_API_URL`` names a server."""
    # Prefect reads the environment when it loads (set by `codepost run` before this call)
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    if PREFECT_API_URL.value():
        return
    server = SubprocessASGIServer()
    try:
        server.start()
    except RuntimeError as exc:  # Prefect's message may hold the server's whole output
        waited = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        exited = server.server_process and server.server_process.poll()
        cause = (
            f"exited with code {exited}"
            if exited is not None
            else f"did not answer within {waited} s"
        )
        raise EphemeralServerError(
            f"Prefect's ephemeral API server {cause} ({type(exc).__name__}); set "
            f"{TIMEOUT_SETTING} higher, or start a server (`prefect server start --host "
            "127.0.0.1`) and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        ) from None
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
