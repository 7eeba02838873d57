"""Isolated execution of untrusted programs in Docker; knows nothing of rewards or models."""

from .api import (
    MAX_PATHS,
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    JudgeSpec,
    Limits,
    TestOutcome,
    ValueCase,
)
from .pool import (
    DEFAULT_IMAGE,
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
    connect_hosts,
    run_in_fresh_container,
)
from .runner import languages

LANGUAGES = languages.names()  # what a Job's language may be: one module each in runner/languages/

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
