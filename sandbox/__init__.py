"""Isolated execution of untrusted programs in Docker; knows nothing of rewards or models."""

from .api import CaseOutcome, ExecStatus, ExecutionResult, Job, JudgeSpec, Limits, TestOutcome
from .pool import (
    DEFAULT_IMAGE,
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
    connect_hosts,
    run_in_fresh_container,
)

__all__ = [
    "DEFAULT_IMAGE",
    "CaseOutcome",
    "ExecStatus",
    "ExecutionResult",
    "Job",
    "JudgeSpec",
    "Limits",
    "PoolConfig",
    "SandboxPool",
    "SandboxUnavailable",
    "TestOutcome",
    "connect_hosts",
    "run_in_fresh_container",
]
