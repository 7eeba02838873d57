"""All-or-nothing writes: every file and folder the pipeline publishes goes through here, so a
reader never sees half of one, a killed run leaves none behind, and a full disk or another I/O
error names the path it was writing instead of the library's own message.

A staging path is named ``.<name>.tmp-<pid>@<host>-<random>``: a process killed mid-write (a
SIGTERM runs no ``finally``) leaves it behind, and the next writer of the same target, or
:func:`remove_stale_staging` when a run takes its folder, removes it once its process is gone."""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Below this much free space, a failed write is reported as a full disk: torch and safetensors
# turn ENOSPC into their own messages ("unexpected pos N vs M").
_NEARLY_FULL_BYTES = 16 * 1024 * 1024


class WriteError(OSError):
    """Writing ``path`` failed; ``strerror`` says why (e.g. "No space left on device")."""


@contextmanager
def staged(target: Path, *, folder: bool = False) -> Iterator[Path]:
    """A staging path beside ``target`` (a file, or a folder with ``folder=True``), renamed
    over ``target`` when the block succeeds and removed when it fails."""
    target = Path(target)
    try:
        staging = _staging(target, folder)
    except OSError as exc:
        raise _named(exc, target) from exc
    try:
        yield staging
        if folder and target.exists():  # an unpublished leftover: replace it
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException as exc:
        named = _named(exc, target) if isinstance(exc, Exception) else None  # while still full
        _remove(staging)
        if named is not None:
            raise named from exc
        raise


def write_text(target: Path, text: str) -> Path:
    with staged(target) as staging:
        staging.write_text(text)
    return Path(target)


def write_json(target: Path, data: Any) -> Path:
    return write_text(target, json.dumps(data, indent=2, sort_keys=True) + "\n")


def append_line(target: Path, line: str) -> None:
    """One line appended with a single write and fsync: a kill leaves the file without it or
    with it whole (a log such as ``metrics.jsonl``)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _named(exc, Path(target)) from exc


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove the staging files and folders under ``root`` whose writer is gone: those of a
    dead process on this host, and those without an owner (written by an older version).
    Call it holding the lock of the folder: nothing else may be writing there."""
    stale = [path for path in Path(root).rglob(".*.tmp-*") if _is_stale(path.name)]
    for path in sorted(stale, key=lambda p: len(p.parts)):  # a stale folder's own leftovers
        _remove(path)
    return stale


_STAGING = re.compile(r"\..+\.tmp-(?:(?P<pid>\d+)@(?P<host>[^/]+)-)?[a-z0-9_]+")


def _is_stale(name: str) -> bool:
    """A staging name whose writer is gone: a dead process on this host, or no owner at all
    (an older version's name)."""
    match = _STAGING.fullmatch(name)
    if match is None:
        return False  # not a staging name
    if match["pid"] is None:
        return True
    if match["host"] != socket.gethostname():
        return False  # another machine's writer (a shared run folder): not ours to judge
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _staging(target: Path, folder: bool) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    for leftover in target.parent.glob(glob.escape(prefix) + "*"):
        if _is_stale(leftover.name):
            _remove(leftover)
    prefix += f"{os.getpid()}@{socket.gethostname()}-"
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    handle, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
    os.close(handle)
    return Path(name)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _named(exc: Exception, target: Path) -> Exception:
    """``exc`` as a :class:`WriteError` naming ``target`` when it is an I/O failure."""
    if isinstance(exc, WriteError):
        return exc
    if isinstance(exc, OSError) and exc.errno is not None:
        return WriteError(exc.errno, f"{os.strerror(exc.errno)} (writing {target})", str(target))
    try:
        nearly_full = shutil.disk_usage(target.parent).free < _NEARLY_FULL_BYTES
    except OSError:
        nearly_full = False
    if nearly_full or os.strerror(errno.ENOSPC) in str(exc):  # safetensors: "... (os error 28)"
        return WriteError(
            errno.ENOSPC, f"No space left on device (writing {target}: {exc})", str(target)
        )
    return exc
