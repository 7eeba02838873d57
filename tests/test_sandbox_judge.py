"""The judge's side of the RPC, in this process (fast): in-place updates, rebuilt exceptions,
failure messages. ``tests/test_sandbox_semantics.py`` checks the same through Docker."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from codepost.sandbox.runner.codec import encode
from codepost.sandbox.runner.judge import (
    CandidateCrashed,
    CandidateError,
    Connection,
    _describe,
    update_in_place,
)


def test_update_in_place_keeps_the_judges_objects():
    row = [0, 0]
    grid = [row, [1, 1]]
    update_in_place(grid, [[0, 9], [1, 1]])
    assert grid == [[0, 9], [1, 1]] and grid[0] is row
    xs, d, s, q, b = [3, 1], {"a": 1}, {1}, deque([1]), bytearray(b"a")
    for old, new in (
        (xs, [1, 3, 5]),
        (d, {"b": 2}),
        (s, {2}),
        (q, deque([2, 3])),
        (b, bytearray(b"xy")),
    ):
        update_in_place(old, new)
        assert old == new
    counter = Counter("ab")
    update_in_place(counter, Counter("bb"))
    assert counter == Counter("bb") and type(counter) is Counter


def test_update_in_place_ignores_a_value_of_another_type():
    xs = [1, 2]
    update_in_place(xs, (1, 2, 3))
    assert xs == [1, 2]


def _rebuilt(info: dict) -> BaseException:
    return Connection(-1, -1).rebuild_exception(info)


def test_custom_exceptions_are_rebuilt_on_their_builtin_bases():
    exc = _rebuilt({"type": "MyErr", "bases": ["ValueError", "Exception"], "message": "bad"})
    assert isinstance(exc, ValueError) and type(exc).__name__ == "MyErr" and str(exc) == "bad"
    both = _rebuilt({"type": "Both", "bases": ["KeyError", "TypeError"], "message": "k"})
    assert isinstance(both, KeyError) and isinstance(both, TypeError)
    key = _rebuilt({"type": "KeyError", "bases": ["KeyError"], "args": encode(["k"], None)})
    assert type(key) is KeyError and str(key) == "'k'"
    assert key.from_candidate  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("info", "kind"),
    [
        ({"type": "SystemExit", "bases": []}, CandidateError),  # not an Exception
        ({"type": "os.system", "bases": ["ValueError"]}, CandidateError),  # not a name
        ({"type": "E", "bases": "ValueError"}, CandidateCrashed),
        ("ValueError", CandidateCrashed),
    ],
)
def test_anything_else_is_a_candidate_error(info, kind):
    assert isinstance(_rebuilt(info), kind)


def test_a_failure_message_that_cannot_be_printed_is_named():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert _describe(AssertionError(10**5000)) == (
        "AssertionError: <message not printable: ValueError>"
    )
    assert _describe(AssertionError(deep)).endswith("RecursionError>")
