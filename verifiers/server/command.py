"""``codepost verify-server``: its settings, and serving a pool until SIGTERM."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from ...sandbox import (
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
)
from ...settings.command_line import EXIT_SANDBOX_UNAVAILABLE, server_command
from ..options import TOKEN_ENV
from ..serving import (
    http_server,
)
from .admission import Admission
from .app import create_app
from .config import PoolServerConfig, ServerConfig


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``verify-server`` subcommand to a ``codepost``-style subparsers object."""
    return server_command(
        subparsers,
        "verify-server",
        ServerConfig,
        serve,
        TOKEN_ENV,
        example="--port 8080 --workers 8 --max-timeout-s 30",
        help="serve the sandbox over HTTP: SandboxFusion's /run_code, /verify, /health, /metrics",
        description=(
            "Serve the warm sandbox pool over HTTP: POST /run_code (SandboxFusion's schema, "
            "Python), POST /verify (codepost verify's samples in, its verdicts out), GET /health "
            "and GET /metrics. Binds to 127.0.0.1 unless --host says otherwise; the bearer token "
            f"is ${TOKEN_ENV} unless --token gives one. SIGTERM lets the accepted requests "
            "finish, then removes the containers."
        ),
    )


def serve(config: ServerConfig) -> int:
    """Start the pool, serve until SIGTERM or Ctrl-C, then close the pool."""

    def stopped(app: FastAPI) -> str:
        admission: Admission = app.state.admission
        return f"{admission.accepted} requests accepted, {admission.answered} answered"

    return serve_pool(
        "verify-server",
        config,
        functools.partial(create_app, config),
        f"up to {config.max_pending} jobs pending",
        stopped,
    )


def serve_pool(
    name: str,
    config: PoolServerConfig,
    create: Callable[[SandboxPool], FastAPI],
    serving: str,
    stopped: Callable[[FastAPI], str],
) -> int:
    """Start a pool and the app ``create`` makes over it, serve until SIGTERM or Ctrl-C, then
    close the pool; ``serving`` and ``stopped`` say what it holds and what it did."""
    # SIGTERM as Ctrl-C: it stops a start-up cleanly, and uvicorn, which drains the server on
    # either, raises the signal again once done: both end here, with the pool closed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pool = SandboxPool(PoolConfig(size=config.workers))
    app = create(pool)
    server = http_server(
        app,
        host=config.host,
        port=config.port,
        limits=config,
        shutdown_timeout_s=config.shutdown_timeout_s,
    )
    try:
        pool.start()
        print(
            f"codepost {name}: http://{config.host}:{config.port} ({config.workers} "
            f"containers, {serving}{', bearer token required' if config.token else ''})",
            file=sys.stderr,
            flush=True,
        )
        server.run()
    except SandboxUnavailable as exc:
        print(f"sandbox unavailable: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_UNAVAILABLE
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    print(
        f"codepost {name}: stopped; {stopped(app)}; the sandbox containers are removed",
        file=sys.stderr,
        flush=True,
    )
    return 0 if server.started else 1
