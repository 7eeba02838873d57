"""A second Docker engine on this machine (its own socket, data and exec roots, no bridge),
holding the sandbox image: scoring across engines without a second machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from codepost.sandbox import DEFAULT_IMAGE


@contextlib.contextmanager
def second_docker_engine() -> Iterator[str]:
    """Yields the engine's ``unix://`` URL; the engine is stopped (by its pid) afterwards."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        pytest.skip("a second Docker engine needs dockerd and root")
    root = Path(tempfile.mkdtemp(prefix="codepost-engine-"))  # short: a socket path is <108
    url = f"unix://{root}/docker.sock"
    with (root / "dockerd.log").open("wb") as log:
        engine = subprocess.Popen(
            [dockerd, "--host", url, "--data-root", f"{root}/data", "--exec-root",
             f"{root}/exec", "--pidfile", f"{root}/docker.pid", "--bridge", "none",
             "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        docker = ["docker", "-H", url]
        deadline = time.monotonic() + 60
        while subprocess.run([*docker, "version"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline or engine.poll() is not None:
                raise RuntimeError(f"the second engine did not start: {root}/dockerd.log")
            time.sleep(0.5)
        save = subprocess.Popen(["docker", "save", DEFAULT_IMAGE], stdout=subprocess.PIPE)
        subprocess.run([*docker, "load", "-q"], stdin=save.stdout, check=True, timeout=300)
        save.wait(timeout=60)
        yield url
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()
        shutil.rmtree(root, ignore_errors=True)
