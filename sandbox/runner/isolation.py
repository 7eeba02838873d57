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
    """Remove everything under ``path`` that this user owns, however it was hidden.

    Iterative and relative to directory descriptors, so neither a deep tree (recursion,
    PATH_MAX) nor a directory made unreadable (mode 000) can stop it. What cannot be removed
    is skipped; the supervisor checks afterwards that the directories are empty.
    """
    with contextlib.suppress(OSError):
        os.chmod(path, 0o755)  # our own /work may have been locked; root's /tmp refuses
    stuck: set[int] = set()  # inodes of directories that could not be emptied
    stack = [(os.open(path, os.O_RDONLY | os.O_DIRECTORY), -1, "")]
    while stack:
        fd, parent, name = stack[-1]
        subdir = None
        with os.scandir(fd) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=fd)
                elif entry.inode() not in stuck:
                    subdir = entry
                    break
        if subdir is not None:
            try:
                os.chmod(subdir.name, 0o700, dir_fd=fd)
                child = os.open(subdir.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                stack.append((child, fd, subdir.name))
            except OSError:
                stuck.add(subdir.inode())
            continue
        stack.pop()
        os.close(fd)
        if parent >= 0:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                stuck.add(os.stat(name, dir_fd=parent, follow_symlinks=False).st_ino)
