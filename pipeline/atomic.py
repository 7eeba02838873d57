"""All-or-nothing writes: every file and folder the pipeline publishes goes through here, so a
reader never sees half of one, a killed run leaves none behind, and a full disk or another I/O
error names the path it was writing instead of the library's own message."""

from __future__ import annotations

import errno
import json
import os
import shutil
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
        _remove(staging)
        if isinstance(exc, Exception):
            raise _named(exc, target) from exc
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


def _staging(target: Path, folder: bool) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
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
    if nearly_full:
        return WriteError(
            errno.ENOSPC, f"No space left on device (writing {target}: {exc})", str(target)
        )
    return exc
