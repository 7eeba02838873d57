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
    PATH_MAX) nor a directory made unreadable (mode 000) can stop it; each directory is read
    once, as reading a tmpfs directory again after each removal is quadratic in its size.
    What cannot be removed is skipped; the supervisor checks afterwards that the directories
    are empty.
    """
    # (directory fd, its parent's fd, its name, its subdirectories not yet removed)
    stack: list[tuple[int, int, str, list[str]]] = [(_open_dir(path), -1, "", [])]
    stack[0][3].extend(_remove_files(stack[0][0]))
    while stack:
        fd, parent, name, subdirs = stack[-1]
        if subdirs:
            child = subdirs.pop()
            try:
                os.chmod(child, 0o700, dir_fd=fd)
                child_fd = _open_dir(child, fd)
            except OSError:
                continue
            stack.append((child_fd, fd, child, _remove_files(child_fd)))
            continue
        stack.pop()
        os.close(fd)
        if parent >= 0:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)


def _remove_files(fd: int) -> list[str]:
    """Unlink everything in the directory but its subdirectories, whose names it returns."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    return subdirs
