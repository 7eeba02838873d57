"""Shared fixtures: one warm sandbox pool per test session for the Docker tests, a Prefect API
per module for the flow tests."""

from __future__ import annotations

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


@pytest.fixture(scope="session", autouse=True)
def _close_process_wide_engines():
    """Stop the engines and pools the stages cache per process, once the session ends."""
    yield
    from codepost.pipeline.resources import close_all

    close_all()
