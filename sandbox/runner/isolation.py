"""Privilege and resource helpers shared by the supervisor and the zygote (stdlib only)."""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any

_MB = 1 << 20


def drop_to(uid: int) -> None:
    """Become ``uid`` for good; the kernel also marks the process non-dumpable."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def set_limits(limits: dict[str, Any], *, cpu: bool = True) -> None:
    """rlimits for one program: enforced by the kernel, whatever the program does."""
    if cpu:
        seconds = max(1, int(limits["cpu_time_s"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    memory = limits["memory_mb"] * _MB
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["disk_mb"] * _MB, limits["disk_mb"] * _MB))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def empty_dir(path: str) -> None:
    """Remove everything under ``path`` that this user may remove."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                os.unlink(full) if os.path.islink(full) else os.rmdir(full)
