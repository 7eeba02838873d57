"""Helpers for the tests of the `codepost` servers (verify-server, sample-server): each started
in its own process on a free port, as a user starts it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from processes import wait_until

STARTUP_S = 120.0


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def codepost(command: str) -> list[str]:
    """The command line of ``codepost COMMAND``, as a user runs it."""
    return [sys.executable, "-m", "codepost.flows.cli", command]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def running_server(
    command: str,
    log_dir: Path,
    *options: str,
    env: dict[str, str | None] | None = None,
    startup_s: float = STARTUP_S,
) -> Iterator[Server]:
    """``codepost COMMAND --port P OPTIONS`` until it answers /health; stopped at the end.
    ``env`` adds variables to this process's environment (None: removes one)."""
    port = free_port()
    environment = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    log = log_dir / f"{command}-{port}.log"
    with log.open("w") as stream:
        process = subprocess.Popen(
            [*codepost(command), "--port", str(port), *options],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        if not wait_until(lambda: process.poll() is not None or healthy(server.url), startup_s):
            pytest.fail(f"the server did not start in {startup_s} s: {log.read_text()}")
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}: {log.read_text()}")
        yield server
    finally:
        if process.poll() is None:
            server.stop()
