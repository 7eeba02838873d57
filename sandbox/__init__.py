"""Isolated execution of untrusted programs in Docker; knows nothing of rewards or models."""

from typing import TYPE_CHECKING, Any

from .api import (
    MAX_PATHS,
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    JudgeSpec,
    Limits,
    SandboxUnavailable,
    TestOutcome,
    ValueCase,
)
from .runner import languages

if TYPE_CHECKING:
    from .pool import (
        DEFAULT_IMAGE,
        PoolConfig,
        SandboxPool,
        connect_hosts,
        run_in_fresh_container,
    )

LANGUAGES = languages.names()  # what a Job's language may be: one module each in runner/languages/
_POOL = frozenset(
    {"DEFAULT_IMAGE", "PoolConfig", "SandboxPool", "connect_hosts", "run_in_fresh_container"}
)


def __getattr__(name: str) -> Any:
    """The pool's names, imported on first use: Docker's client takes a process 0.2 s to
    import, which one that never runs a program here (``codepost verify --server``, the
    command line's help) does not pay."""
    if name in _POOL:
        from . import pool

        return getattr(pool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_IMAGE",
    "LANGUAGES",
    "MAX_PATHS",
    "CaseOutcome",
    "CompileOutcome",
    "ExecStatus",
    "ExecutionResult",
    "Job",
    "JudgeSpec",
    "Limits",
    "PoolConfig",
    "SandboxPool",
    "SandboxUnavailable",
    "TestOutcome",
    "ValueCase",
    "connect_hosts",
    "run_in_fresh_container",
]
