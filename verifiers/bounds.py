"""What reading one problem may cost: the bounds a server puts on the problems its callers send.

Reading a record does work its size does not bound: packed tests inflate (LiveCodeBench's
private tests; zlib reaches about 1000x) and Python test code is parsed (``ast.parse`` holds
the interpreter lock for about 4 µs a character and builds about 700 times the source's size
in syntax tree). A server reads a caller's problems within :func:`reading_within`, and each
reader checks its bound before the work. Problems read anywhere else (files, the hub, the sets
shipped with codepost) get :class:`ReadingBounds`' defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class ReadingBounds:
    unpacked_bytes: int = 1 << 30  # one packed field inflated (a data set's largest: tens of MB)
    code_chars: int | None = None  # one piece of a problem's Python code (None: any length)


DEFAULT_BOUNDS = ReadingBounds()
_BOUNDS: ContextVar[ReadingBounds] = ContextVar("reading_bounds", default=DEFAULT_BOUNDS)


def reading_bounds() -> ReadingBounds:
    """The bounds of the problems being read here (this thread, this task)."""
    return _BOUNDS.get()


@contextlib.contextmanager
def reading_within(bounds: ReadingBounds) -> Iterator[None]:
    """Read problems within ``bounds`` in this block (a context variable: other threads and
    tasks keep theirs)."""
    token = _BOUNDS.set(bounds)
    try:
        yield
    finally:
        _BOUNDS.reset(token)
