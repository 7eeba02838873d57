"""Plain-data codec shared by the judge and the candidate, and the frame format of every pipe.

Only the decoder's output can reach a test's comparison, so the decoder is the security
boundary: whatever bytes the candidate writes, decoding yields exact builtin types (None,
bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset) or references
made by the trusted side. The encoder only has to be correct for honest programs.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Callable
from typing import Any

MAX_FRAME_BYTES = 64 << 20
MAX_DEPTH = 200
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame or value."""


class PeerClosed(ProtocolError):
    """The peer closed its end (it exited or was killed)."""


def write_frame(fd: int, message: Any) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise PeerClosed("peer closed the pipe")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    (size,) = _HEADER.unpack(read_exact(fd, _HEADER.size))
    if size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the {max_bytes} byte limit")
    try:
        return json.loads(read_exact(fd, size))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None


def encode(value: Any, make_ref: Callable[[Any], int], depth: int = 0) -> Any:
    """Turn a value into JSON-able data; objects that are not plain data become references."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return str.__str__(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [encode(v, make_ref, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"tuple": [encode(v, make_ref, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {
            "dict": [
                [encode(k, make_ref, depth + 1), encode(v, make_ref, depth + 1)]
                for k, v in dict.items(value)
            ]
        }
    if isinstance(value, (set, frozenset)):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        return {tag: [encode(v, make_ref, depth + 1) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, complex):
        return {"complex": [complex(value).real, complex(value).imag]}
    if isinstance(value, type) and _TYPES.get(value.__name__) is value:
        return {"type": value.__name__}
    return {"ref": make_ref(value)}


_SCALARS = (type(None), bool, int, float, str)
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
        list,
        tuple,
        dict,
        set,
        frozenset,
        type(None),
        object,
    )
}


def decode(data: Any, resolve_ref: Callable[[int], Any], depth: int = 0) -> Any:
    """Rebuild plain data from ``encode``'s output; raise ProtocolError on anything else."""
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    if type(data) in _SCALARS:
        return data
    if type(data) is list:
        return [decode(v, resolve_ref, depth + 1) for v in data]
    if type(data) is not dict or len(data) != 1:
        raise ProtocolError(f"not an encoded value: {type(data).__name__}")
    ((tag, payload),) = data.items()
    try:
        if tag == "ref" and type(payload) is int:
            return resolve_ref(payload)
        if tag == "type" and payload in _TYPES:
            return _TYPES[payload]
        if tag == "bytes" and type(payload) is str:
            return base64.b64decode(payload, validate=True)
        if tag == "complex" and type(payload) is list and len(payload) == 2:
            if not all(type(part) in (int, float) for part in payload):
                raise ProtocolError("bad complex payload")
            return complex(payload[0], payload[1])
        if type(payload) is not list:
            raise ProtocolError(f"bad payload for {tag!r}")
        items = [decode(v, resolve_ref, depth + 1) for v in payload]
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        if tag == "dict":
            if not all(type(pair) is list and len(pair) == 2 for pair in items):
                raise ProtocolError("bad dict payload")
            return {k: v for k, v in items}
    except (TypeError, ValueError) as exc:  # unhashable set members, bad base64, ...
        raise ProtocolError(f"bad {tag!r} value: {exc}") from None
    raise ProtocolError(f"unknown tag {tag!r}")
