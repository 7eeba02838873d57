"""The plain-data codec: the boundary that keeps candidate objects out of test comparisons."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, namedtuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codepost.sandbox.runner.codec import ProtocolError, decode, encode


def _no_refs(obj):
    raise AssertionError(f"unexpected reference to {obj!r}")


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.integers() | st.text(), children, max_size=4)
        | st.frozensets(st.integers() | st.text(), max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(plain)
def test_plain_data_round_trips_with_exact_types(value):
    decoded = decode(encode(value, _no_refs), _no_refs)
    assert decoded == value
    assert type(decoded) is type(value)


def test_subclasses_of_plain_types_arrive_as_the_plain_type():
    Point = namedtuple("Point", "x y")
    for value, plain_type in [
        (Counter("aab"), dict),
        (OrderedDict(a=1), dict),
        (Point(1, 2), tuple),
        (True, bool),
    ]:
        decoded = decode(encode(value, _no_refs), _no_refs)
        assert type(decoded) is plain_type
        assert decoded == value


def test_builtin_types_travel_by_name_and_others_by_reference():
    assert decode(encode([int, str, type(None)], _no_refs), _no_refs) == [int, str, type(None)]
    assert encode(type("int", (), {}), lambda obj: 7) == {"ref": 7}  # a fake named "int"
    with pytest.raises(ProtocolError):
        decode({"type": "os"}, _no_refs)


def test_objects_become_references():
    refs = []
    data = encode([1, object(), len], lambda obj: refs.append(obj) or len(refs))
    assert data == [1, {"ref": 1}, {"ref": 2}]
    assert decode(data, lambda ref: f"ref{ref}") == [1, "ref1", "ref2"]


@pytest.mark.parametrize(
    "forged",
    [
        {"__eq__": 1},
        {"tuple": "abc"},
        {"dict": [[1]]},
        {"set": [[1, 2]]},  # unhashable member
        {"bytes": "!!!"},
        {"complex": ["1", 2]},
        {"pickle": "gASV"},
        {"tuple": [], "extra": 1},
    ],
)
def test_forged_payloads_are_rejected(forged):
    with pytest.raises(ProtocolError):
        decode(forged, _no_refs)


def test_nan_and_infinities_survive():
    decoded = decode(encode([math.nan, math.inf, -math.inf], _no_refs), _no_refs)
    assert math.isnan(decoded[0]) and decoded[1:] == [math.inf, -math.inf]


def test_deep_nesting_is_refused_not_crashing():
    deep: list = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep, _no_refs)
