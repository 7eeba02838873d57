"""What reading problems may cost: the bounds a server puts on the problems its callers send.

Reading a record does work its size does not bound: packed tests inflate (LiveCodeBench's
private tests; zlib reaches about 1000x) and Python test code is parsed (``ast.parse`` holds
the interpreter lock for about 4 µs a character and builds about 700 times the source's size
in syntax tree). A server reads a caller's problems within :func:`reading_within`, and each
reader checks its bound before the work: one piece's bound, and a :class:`Budget` that all the
problems of one request spend together (many records each just under one piece's bound add
up). Problems read anywhere else (files, the hub, the sets shipped with codepost) get
:class:`ReadingBounds`' defaults, which have no budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Budget:
    """What the problems read within one set of bounds may cost together, spent as they are
    read (one request's: a budget is never shared between requests)."""

    unpacked_bytes: int  # packed test data inflated
    code_chars: int  # Python code parsed
    tests: int  # test cases unpacked

    def spend(self, kind: str, amount: int, what: str) -> None:
        """Spend ``amount`` of ``kind``; ValueError naming ``what`` when too little is left."""
        left = getattr(self, kind)
        if amount > left:
            raise ValueError(
                f"{what} would take the problems read together past their bound on "
                f"{kind.replace('_', ' ')} ({left} left, {amount} needed): send fewer problems "
                "in one request"
            )
        setattr(self, kind, left - amount)


@dataclass(frozen=True)
class ReadingBounds:
    unpacked_bytes: int = 1 << 30  # one packed field inflated (a data set's largest: tens of MB)
    code_chars: int | None = None  # one piece of a problem's Python code (None: any length)
    budget: Budget | None = None  # all the problems read within these bounds (None: no bound)


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
