"""Process-wide resources the stages keep warm between calls (sampling engines, sandbox
pools), and the one call that closes them all: a stage worker or a test session ends with
:func:`close_all` instead of knowing which modules hold what."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

_CLOSERS: list[Callable[[], None]] = []
_LOCK = threading.Lock()
Closer = TypeVar("Closer", bound=Callable[[], None])


def on_close(close: Closer) -> Closer:
    """Register ``close`` (idempotent, safe to call when nothing is open) for :func:`close_all`."""
    with _LOCK:
        if close not in _CLOSERS:
            _CLOSERS.append(close)
    return close


def close_all() -> None:
    """Close every registered resource, the last registered first."""
    with _LOCK:
        closers = list(reversed(_CLOSERS))
    for close in closers:
        close()
