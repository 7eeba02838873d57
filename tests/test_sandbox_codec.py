"""The plain-data codec: the boundary that keeps candidate objects out of test comparisons."""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

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
    decoded = _round_trip(value)
    assert decoded == value
    assert type(decoded) is type(value)


def _round_trip(value):
    return decode(json.loads(json.dumps(encode(value, _no_refs))), _no_refs)


Point = namedtuple("Point", "x y")
STDLIB_VALUES = [
    10**5000,  # past the 4,300 digits of int <-> str
    -(10**5000) - 1,
    bytearray(b"ab"),
    range(1, 10, 3),
    Fraction(10**5000, 3),
    Decimal("1.10"),  # the exponent survives: str() is "1.10", not "1.1"
    Decimal("-Infinity"),
    {"a": 1}.keys(),
    {"a": 1}.items(),
    OrderedDict(b=1, a=2),
    Counter("aab"),
    defaultdict(list, {1: [2]}),
    deque([1, 2], maxlen=3),
    Point(1, (2, 3)),
    date(2024, 2, 29),
    time(23, 59, 1, 5, tzinfo=timezone.utc),
    datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=-3), "X"), fold=1),
    timedelta(days=-2, seconds=7, microseconds=9),
]


@pytest.mark.parametrize("value", STDLIB_VALUES, ids=lambda v: type(v).__name__)
def test_standard_library_values_arrive_as_the_same_type(value):
    decoded = _round_trip(value)
    assert type(decoded) is type(value) or (type(value) is Point and decoded._fields == ("x", "y"))
    assert decoded == value


def test_dict_values_and_subclasses_keep_their_data():
    assert list(_round_trip({"a": 1, "b": [2]}.values())) == [1, [2]]
    assert type(_round_trip(Counter("ab").keys())) is type({}.keys())
    assert str(_round_trip(Decimal("1.10"))) == "1.10"

    class Loud(int):
        def __eq__(self, other):
            return True

    assert type(_round_trip(Loud(3))) is int
    assert _round_trip(defaultdict(int, a=1)).default_factory is int


def test_deep_nesting_round_trips_without_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    decoded = _round_trip(deep)
    for _ in range(100_000):
        (decoded,) = decoded
    assert decoded == []


def test_a_value_that_contains_itself_is_refused_naming_the_limit():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        encode(loop, _no_refs)


def test_builtin_types_travel_by_name_and_others_by_reference():
    assert _round_trip([int, str, type(None)]) == [int, str, type(None)]
    assert encode(type("int", (), {}), lambda obj: 7) == [["ref", 0, 7]]  # a fake named "int"
    with pytest.raises(ProtocolError):
        decode([["type", 0, "os"]], _no_refs)


def test_objects_become_references():
    refs = []
    data = encode([1, object(), len], lambda obj: refs.append(obj) or len(refs))
    assert data == [["list", 3], 1, ["ref", 0, 1], ["ref", 0, 2]]
    assert decode(data, lambda ref: f"ref{ref}") == [1, "ref1", "ref2"]


@pytest.mark.parametrize(
    "forged",
    [
        {"__eq__": 1},
        [["tuple", 2], 1],  # truncated
        [1, 2],  # two values
        [["dict", 1], 1],  # half a pair
        [["set", 1], ["list", 0]],  # unhashable member
        [["bytes", 0, "!!!"]],
        [["complex", 0, "1", 2]],
        [["pickle", 0, "gASV"]],
        [["list", -1]],
        [["list", 0, ["nested params"]]],
        [["int", 0, "zz"]],
        [["Fraction", 2], 1, 0],
        [["Fraction", 2], 1.5, 2],
        [["namedtuple", 1, "a b", "x"], 1],
        [["defaultdict", 1], 5],
        [["datetime", 1, 2024, 13, 1, 0, 0, 0, 0, 0], None],
        [["time", 1, 1, 2, 3, 4, 0], 5],  # a tzinfo that is not one
        [["dict_items", 1], 1],
    ],
)
def test_forged_payloads_are_rejected(forged):
    with pytest.raises(ProtocolError):
        decode(forged, _no_refs)


def test_nan_and_infinities_survive():
    decoded = _round_trip([math.nan, math.inf, -math.inf])
    assert math.isnan(decoded[0]) and decoded[1:] == [math.inf, -math.inf]


def test_shared_parts_are_encoded_where_they_occur():
    row = [0, 0]
    assert _round_trip([row, row, (row,)]) == [[0, 0], [0, 0], ([0, 0],)]
