"""Plain-data codec shared by the judge and the candidate (their frames are ``wire``'s).

Only the decoder's output can reach a test's comparison, so the decoder is the security
boundary: whatever bytes the candidate writes, decoding yields exact builtin and standard-library
value types, rebuilt by the trusted side from their data, or references made by the trusted
side. The encoder only has to be correct for honest programs.

A value travels as a flat list of tokens in prefix order, so nesting costs no recursion on
either side (and none in ``json``): a token is a JSON scalar (None, bool, small int, float,
str) or a header ``[tag, children, *params]`` followed by its ``children`` values.
"""

from __future__ import annotations

import base64
import builtins
import functools
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from .wire import ProtocolError, Unsendable

MAX_TOKENS = 16_000_000  # items in one encoded value (shared parts count where they occur)
_BIG_INT_BITS = 10_000  # larger ints travel as hex: decimal text is capped at 4,300 digits


# -- encoding: one value -> (token, children)

Encoded = tuple[Any, list[Any]]
MakeRef = Callable[[Any], int]


def _int(value: int) -> Any:
    value = int.__int__(value)
    return value if value.bit_length() <= _BIG_INT_BITS else ["int", 0, hex(value)]


def _pairs(items: Iterable[tuple[Any, Any]]) -> list[Any]:
    return [part for pair in items for part in pair]


def _tuple(value: tuple, cls: type) -> Encoded:
    fields = getattr(type(value), "_fields", None)
    items = list(tuple.__iter__(value))
    if type(fields) is tuple and len(fields) == len(items):  # a namedtuple
        return ["namedtuple", len(items), type(value).__name__, *map(str, fields)], items
    return ["tuple", len(items)], items


def _own(cls: type, value: Any, *names: str) -> list[Any]:
    """The attributes ``names`` of ``value`` as the standard library's ``cls`` stores them: a
    subclass's property or method of the same name is not called."""
    return [cls.__dict__[name].__get__(value, cls) for name in names]


def _dict(value: dict) -> list[Any]:
    return _pairs(dict.items(value))


# (module, qualified name) of a class in the value's MRO -> its encoding, from the value's own
# data as that class stores it, never through the program's methods (an int subclass whose
# ``__int__`` says 7 is still 3). The first class of the MRO found here wins, so a Counter is a
# Counter and any other dict subclass a dict.
_ENCODERS: dict[tuple[str, str], Callable[[Any, Any], Encoded]] = {
    ("builtins", "bool"): lambda v, c: (bool(v), []),
    ("builtins", "int"): lambda v, c: (_int(v), []),
    ("builtins", "float"): lambda v, c: (float.__float__(v), []),
    ("builtins", "str"): lambda v, c: (str.__str__(v), []),
    ("builtins", "complex"): lambda v, c: (["complex", 0, *_own(complex, v, "real", "imag")], []),
    ("builtins", "bytes"): lambda v, c: (
        ["bytes", 0, base64.b64encode(memoryview(v)).decode()],
        [],
    ),
    ("builtins", "bytearray"): lambda v, c: (
        ["bytearray", 0, base64.b64encode(memoryview(v)).decode()],
        [],
    ),
    ("builtins", "list"): lambda v, c: (["list", list.__len__(v)], list(list.__iter__(v))),
    ("builtins", "tuple"): _tuple,
    ("builtins", "set"): lambda v, c: (["set", set.__len__(v)], list(set.__iter__(v))),
    ("builtins", "frozenset"): lambda v, c: (
        ["frozenset", frozenset.__len__(v)],
        list(frozenset.__iter__(v)),
    ),
    ("builtins", "dict"): lambda v, c: (["dict", 2 * dict.__len__(v)], _dict(v)),
    ("builtins", "range"): lambda v, c: (["range", 3], [v.start, v.stop, v.step]),
    ("builtins", "dict_keys"): lambda v, c: (["dict_keys", len(v)], list(v)),
    ("builtins", "dict_values"): lambda v, c: (["dict_values", len(v)], list(v)),
    ("builtins", "dict_items"): lambda v, c: (["dict_items", len(v)], list(v)),
    ("collections", "OrderedDict"): lambda v, c: (
        ["OrderedDict", 2 * dict.__len__(v)],
        _pairs(c.items(v)),
    ),
    ("collections", "Counter"): lambda v, c: (["Counter", 2 * dict.__len__(v)], _dict(v)),
    ("collections", "defaultdict"): lambda v, c: (
        ["defaultdict", 1 + 2 * dict.__len__(v)],
        [*_own(c, v, "default_factory"), *_dict(v)],
    ),
    ("collections", "deque"): lambda v, c: (
        ["deque", c.__len__(v), *_own(c, v, "maxlen")],
        list(c.__iter__(v)),
    ),
    ("fractions", "Fraction"): lambda v, c: (
        ["Fraction", 2],
        _own(c, v, "_numerator", "_denominator"),
    ),
    ("decimal", "Decimal"): lambda v, c: (["Decimal", 0, c.__str__(v)], []),
    ("datetime", "timedelta"): lambda v, c: (
        ["timedelta", 0, *_own(c, v, "days", "seconds", "microseconds")],
        [],
    ),
    ("datetime", "date"): lambda v, c: (["date", 0, *_own(c, v, "year", "month", "day")], []),
    ("datetime", "time"): lambda v, c: (
        ["time", 1, *_own(c, v, "hour", "minute", "second", "microsecond", "fold")],
        _own(c, v, "tzinfo"),
    ),
    ("datetime", "datetime"): lambda v, c: (
        [
            "datetime",
            1,
            *_own(c.__base__, v, "year", "month", "day"),
            *_own(c, v, "hour", "minute", "second", "microsecond", "fold"),
        ],
        _own(c, v, "tzinfo"),
    ),
    ("datetime", "timezone"): lambda v, c: (
        ["timezone", 1, c.tzname(v, None)],
        [c.utcoffset(v, None)],
    ),
    ("zoneinfo", "ZoneInfo"): lambda v, c: (["ZoneInfo", 0, *_own(c, v, "key")], []),
}


def _encoder(kind: type) -> Callable[[Any], Encoded] | None:
    """The encoder of the first class of ``kind``'s MRO that has one (cached per class)."""
    if kind not in _ENCODER_OF:
        found = (
            (cls, _ENCODERS[key])
            for cls in kind.__mro__
            if (key := (cls.__module__, cls.__qualname__)) in _ENCODERS
        )
        match = next(found, None)
        _ENCODER_OF[kind] = None if match is None else functools.partial(_apply, *match)
    return _ENCODER_OF[kind]


def _apply(cls: type, encoder: Callable[[Any, Any], Encoded], value: Any) -> Encoded:
    return encoder(value, cls)


_ENCODER_OF: dict[type, Callable[[Any], Encoded] | None] = {}
_PLAIN = frozenset({str, float, bool, type(None)})  # exact types that are their own token
_INTS = frozenset({int, bool})
_PLAIN_OR_INT = _PLAIN | _INTS
_SMALL = 1 << _BIG_INT_BITS


def _encode_one(value: Any, make_ref: MakeRef) -> Encoded:
    if isinstance(value, type):
        name = value.__name__
        if _TYPES.get(name) is value:
            return ["type", 0, name], []
        return ["ref", 0, make_ref(value)], []
    encoder = _encoder(type(value))
    return encoder(value) if encoder is not None else (["ref", 0, make_ref(value)], [])


def _scalars(children: list[Any]) -> bool:
    """Whether every child is its own token, checked at C speed: the large results (a list of
    millions of numbers or strings) then cost no step of ``encode``'s loop per item."""
    kinds = set(map(type, children))
    if not kinds <= _PLAIN_OR_INT:
        return False
    if int in kinds:
        return kinds <= _INTS and max(map(int.bit_length, children)) <= _BIG_INT_BITS
    return True


def encode(value: Any, make_ref: MakeRef) -> list[Any]:
    """The tokens of a value; objects that are not plain data become references.

    A container inside itself is refused at once; shared parts are encoded where they occur.
    """
    tokens: list[Any] = []
    pending: list[Any] = [value]
    inside: set[int] = set()  # ids of the containers being encoded (the path from the root)
    while pending:
        if len(tokens) > MAX_TOKENS:
            raise Unsendable(f"it has more than {MAX_TOKENS} items")
        value = pending.pop()
        kind = type(value)
        if kind in _PLAIN or (kind is int and -_SMALL < value < _SMALL):
            tokens.append(value)
        elif kind is _Leave:
            inside.discard(value.id)
        else:
            token, children = _encode_one(value, make_ref)
            tokens.append(token)
            if not children:
                continue
            if _scalars(children):
                tokens.extend(children)
                continue
            if id(value) in inside:
                raise Unsendable("it contains itself")
            inside.add(id(value))
            pending.append(_Leave(id(value)))
            pending.extend(reversed(children))
    if len(tokens) > MAX_TOKENS:
        raise Unsendable(f"it has more than {MAX_TOKENS} items")
    return tokens


class _Leave:
    """A marker in ``encode``'s work list: the container with this id is done."""

    __slots__ = ("id",)

    def __init__(self, id_: int) -> None:
        self.id = id_


# -- decoding: tokens -> values rebuilt by the trusted side

# Builtin types travel by name (``remove_datatype(xs, int)``); they cannot be patched.
_TYPES = {
    t.__name__: t
    for t in (
        bool,
        int,
        float,
        complex,
        str,
        bytes,
        bytearray,
        list,
        tuple,
        dict,
        set,
        frozenset,
        range,
        type(None),
        object,
    )
}
_SCALARS = (type(None), bool, int, float, str)
_SCALAR_SET = frozenset(_SCALARS)
_LEAF_PARAMS = (int, float, str, type(None), bool)


def _exact(kind: type | tuple[type, ...], *values: Any) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not all(type(v) in kinds for v in values):
        raise ProtocolError(f"expected {'/'.join(k.__name__ for k in kinds)}")


def _dict_pairs(items: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(items[::2], items[1::2], strict=True))


def _namedtuple(classes: dict[Any, type], typename: str, fields: tuple[str, ...]) -> type:
    """The namedtuple class of ``typename`` and ``fields``, made once per decoding session
    (``classes``): the program names it, so nothing keeps it past the session."""
    if (typename, fields) not in classes:
        from collections import namedtuple

        classes[typename, fields] = namedtuple(typename, fields)
    return classes[typename, fields]


def _tzinfo(value: Any) -> Any:
    import datetime

    if value is not None and not isinstance(value, datetime.tzinfo):
        raise ProtocolError("bad tzinfo")
    return value


def _build_leaf(tag: str, params: list[Any], resolve_ref: Callable[[int], Any]) -> Any:
    if tag == "ref":
        _exact(int, *params)
        return resolve_ref(*params)
    if tag == "type":
        _exact(str, *params)
        return _TYPES[params[0]]
    if tag == "int":
        _exact(str, *params)
        return int(params[0], 16)
    if tag in ("bytes", "bytearray"):
        _exact(str, *params)
        data = base64.b64decode(params[0], validate=True)
        return data if tag == "bytes" else bytearray(data)
    if tag == "complex":
        _exact((int, float), *params)
        return complex(*params)
    if tag == "Decimal":
        from decimal import Decimal

        _exact(str, *params)
        return Decimal(params[0])
    if tag == "ZoneInfo":
        from zoneinfo import ZoneInfo

        _exact(str, *params)
        return ZoneInfo(params[0])
    import datetime

    _exact(int, *params)
    kinds = {"timedelta": datetime.timedelta, "date": datetime.date}
    return kinds[tag](*params)


def _build(tag: str, params: list[Any], items: list[Any], classes: dict[Any, type]) -> Any:
    if tag == "list":
        return items
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    if tag == "dict":
        return dict(_dict_pairs(items))
    if tag == "dict_keys":
        return dict.fromkeys(items).keys()
    if tag == "dict_values":
        return dict(enumerate(items)).values()
    if tag == "dict_items":
        if not all(type(item) is tuple and len(item) == 2 for item in items):
            raise ProtocolError("bad dict_items")
        return dict(items).items()
    if tag == "range":
        _exact(int, *items)
        return range(*items)
    if tag == "namedtuple":
        _exact(str, *params)
        return _namedtuple(classes, params[0], tuple(params[1:]))(*items)
    if tag == "Fraction":
        from fractions import Fraction

        _exact(int, *items)
        return Fraction(*items)
    return _build_collection(tag, params, items)


def _build_collection(tag: str, params: list[Any], items: list[Any]) -> Any:
    import collections
    import datetime

    if tag == "OrderedDict":
        return collections.OrderedDict(_dict_pairs(items))
    if tag == "Counter":
        return collections.Counter(dict(_dict_pairs(items)))
    if tag == "defaultdict":
        factory = items[0]
        if factory is not None and not callable(factory):
            raise ProtocolError("bad default_factory")
        return collections.defaultdict(factory, _dict_pairs(items[1:]))
    if tag == "deque":
        _exact((int, type(None)), *params)
        return collections.deque(items, *params)
    if tag == "timezone":
        _exact((str, type(None)), *params)
        _exact(datetime.timedelta, *items)
        return (
            datetime.timezone(*items, *params)
            if params[0] is not None
            else (datetime.timezone(*items))
        )
    if tag in ("time", "datetime"):
        _exact(int, *params)
        kind = datetime.time if tag == "time" else datetime.datetime
        *fields, fold = params
        return kind(*fields, tzinfo=_tzinfo(*items), fold=fold)  # type: ignore[misc]
    raise ProtocolError(f"unknown tag {tag!r}")


_LEAVES = frozenset(
    {
        "ref",
        "type",
        "int",
        "bytes",
        "bytearray",
        "complex",
        "Decimal",
        "ZoneInfo",
        "timedelta",
        "date",
    }
)
_NOTHING = object()


def decode(
    tokens: Any, resolve_ref: Callable[[int], Any], classes: dict[Any, type] | None = None
) -> Any:
    """Rebuild a value from ``encode``'s tokens; raise ProtocolError on anything else.
    ``classes`` keeps the classes it makes (namedtuples) for the decoding session's next
    values."""
    classes = {} if classes is None else classes
    if type(tokens) is not list:
        raise ProtocolError(f"not an encoded value: {type(tokens).__name__}")
    open_: list[tuple[str, list[Any], int, list[Any]]] = []  # containers still being filled
    result: Any = _NOTHING
    position, end = 0, len(tokens)
    try:
        while position < end:
            if result is not _NOTHING:
                raise ProtocolError("tokens after the end of the value")
            value = _decode_token(tokens[position], resolve_ref, open_, classes)
            position += 1
            if value is _NOTHING:  # a container opened: all-scalar children are taken at once
                tag, params, size, _ = open_[-1]
                children = tokens[position : position + size]
                if len(children) == size and _SCALAR_SET.issuperset(map(type, children)):
                    open_.pop()
                    position += size
                    value = _build(tag, params, children, classes)
            while value is not _NOTHING:
                if not open_:
                    result = value
                    break
                tag, params, size, items = open_[-1]
                items.append(value)
                if len(items) < size:
                    break
                open_.pop()
                value = _build(tag, params, items, classes)
    except (TypeError, ValueError, LookupError, ArithmeticError) as exc:
        raise ProtocolError(f"bad value: {exc!r}"[:200]) from None
    if open_ or result is _NOTHING:
        raise ProtocolError("truncated value")
    return result


def _decode_token(
    token: Any, resolve_ref: Callable[[int], Any], open_: list, classes: dict[Any, type]
) -> Any:
    """A scalar or leaf as its value; a container header opens it (``_NOTHING`` until full)."""
    if type(token) in _SCALARS:
        return token
    if type(token) is not list or len(token) < 2:
        raise ProtocolError(f"not a token: {type(token).__name__}")
    tag, size, *params = token
    if type(tag) is not str or type(size) is not int or size < 0:
        raise ProtocolError("bad header")
    _exact(_LEAF_PARAMS, *params)
    if tag in _LEAVES:
        if size:
            raise ProtocolError(f"{tag!r} has no children")
        return _build_leaf(tag, params, resolve_ref)
    if size == 0:
        return _build(tag, params, [], classes)
    open_.append((tag, params, size, []))
    return _NOTHING


def module_namespace(name: str) -> dict[str, Any]:
    """The namespace of a new module ``name`` registered in ``sys.modules``, as import and
    ``python3 program.py`` register theirs: dataclasses, typing and pickle (so
    multiprocessing) look a program's classes and functions up there."""
    module = types.ModuleType(name)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module.__dict__


def builtin_exception(name: str) -> type[Exception] | None:
    """The builtin exception class called ``name`` (None for anything else)."""
    cls = getattr(builtins, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None
