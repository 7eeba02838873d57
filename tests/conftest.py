"""Shared fixtures: one warm sandbox pool per test session for the Docker tests, a Prefect API
per module for the flow tests, a tiny filesystem for the disk-full tests."""

from __future__ import annotations

import gc
import os
import subprocess

import pytest

from codepost.sandbox import PoolConfig, SandboxPool, SandboxUnavailable


@pytest.fixture(scope="session")
def sandbox_pool():
    pool = SandboxPool(PoolConfig(size=4))
    try:
        pool.start()
    except SandboxUnavailable as exc:
        pytest.fail(f"the Docker sandbox is required for this test: {exc}")
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def prefect_api():
    """A real, temporary Prefect server (its own database) for the module's flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs: writes past it fail with ENOSPC, as on a full disk. Mounting needs root."""
    mount = tmp_path / "tiny-fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs for the disk-full test needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test: {mounted.stderr.strip()}")
    yield mount
    gc.collect()  # a writer the failure left open (torch's zip writer) keeps the mount busy
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="session", autouse=True)
def _close_process_wide_engines():
    """Stop the engines and pools the stages cache per process, once the session ends."""
    yield
    from codepost.pipeline.resources import close_all

    close_all()
