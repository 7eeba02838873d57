"""What the host and the sandbox say to each other, and the frame every one of their pipes carries.

A frame is a 4-byte big-endian length, then that many bytes of JSON. The host (``pool.py``)
sends a ``Request``, a ping or a job; the supervisor answers a job with heartbeats while it
runs, then its ``Result``. Inside the container the zygotes' children, the judge and the
supervisor frame their messages the same way, and read them with ``read_frame`` (from a pipe)
or ``split_frame`` (from the bytes a pipe or socket carried).

The messages' types are the type checker's only: the zygotes import this module for its frames,
and every class they hold is memory that each of their forks maps.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

MAX_FRAME_BYTES = 64 << 20
HEADER = struct.Struct(">I")
_ONE_WRITE = 1 << 16  # frames up to this size go out in one write, header included


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame or value."""


class PeerClosed(ProtocolError):
    """The peer closed its end (it exited or was killed)."""


class Unsendable(ValueError):
    """A value the codec refuses to send: too many items, too many bytes, or inside itself."""


def _json(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def frame(message: Any) -> bytes:
    """``message`` as one frame: a 4-byte length, then its JSON."""
    data = _json(message)
    return HEADER.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    """All of ``data``, however the pipe splits it (a signal can cut a large write short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, message: Any, max_bytes: int | None = None) -> None:
    """Send ``message``; a frame over ``max_bytes`` raises ``Unsendable`` before any byte goes."""
    data = _json(message)
    if max_bytes is not None and len(data) > max_bytes:
        raise Unsendable(f"it is {len(data)} bytes encoded, over the {max_bytes} byte limit")
    header = HEADER.pack(len(data))
    # One write wakes the reader once; a large frame is not copied to prepend 4 bytes.
    for part in (header + data,) if len(data) <= _ONE_WRITE else (header, data):
        write_all(fd, part)


def read_exact(fd: int, n: int) -> bytes | bytearray:
    """``n`` bytes; a large frame is read into one buffer (no chunks to join: held once)."""
    first = os.read(fd, n)
    if len(first) == n:
        return first
    if not first:
        raise PeerClosed("peer closed the pipe")
    data = bytearray(n)
    data[: len(first)] = first
    view, got = memoryview(data), len(first)
    while got < n:
        count = os.readv(fd, [view[got:]])
        if not count:
            raise PeerClosed("peer closed the pipe")
        got += count
    return data


def read_frame(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """The next frame's message on the pipe ``fd``, waiting for all of it."""
    size = _size(read_exact(fd, HEADER.size), 0, max_bytes)
    return _loads(read_exact(fd, size))


def split_frame(
    data: bytes | bytearray, offset: int = 0, max_bytes: int | None = MAX_FRAME_BYTES
) -> tuple[Any, int] | None:
    """The message of the frame at ``offset`` of ``data`` and where that frame ends; None while
    ``data`` holds only part of it. ``max_bytes`` None: any size (a trusted peer's)."""
    if len(data) - offset < HEADER.size:
        return None
    end = offset + HEADER.size + _size(data, offset, max_bytes)
    if end > len(data):
        return None
    return _loads(data[offset + HEADER.size : end]), end


def frames_in(data: bytes | bytearray, max_bytes: int = MAX_FRAME_BYTES) -> Iterator[Any]:
    """The frames of ``data``, all a pipe carried, as ``read_frame`` takes them from the pipe
    one by one: with its errors, and ``PeerClosed`` where the bytes end."""
    offset = 0
    while (found := split_frame(data, offset, max_bytes)) is not None:
        message, offset = found
        yield message
    raise PeerClosed("peer closed the pipe")


def complete_frames(data: bytes | bytearray) -> list[Any]:
    """The whole frames of what a trusted process wrote before it ended (or was stopped)."""
    frames = []
    offset = 0
    while (found := split_frame(data, offset)) is not None:
        message, offset = found
        frames.append(message)
    return frames


def _size(data: bytes | bytearray, offset: int, max_bytes: int | None) -> int:
    (size,) = HEADER.unpack_from(data, offset)
    if max_bytes is not None and size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the {max_bytes} byte limit")
    return size


def _loads(data: bytes | bytearray) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None


if TYPE_CHECKING:
    from typing import Literal, NotRequired, TypedDict, final

    class Rlimits(TypedDict):
        """What a process is held to by the kernel (``isolation.set_limits``)."""

        cpu_time_s: float
        memory_mb: int  # its address space
        disk_mb: int  # the largest file it may write
        processes: int  # threads and processes at once

    class Limits(Rlimits):
        """A job's limits: ``api.Limits``, and what the pool adds."""

        wall_time_s: float
        output_bytes: int
        compile_time_s: float
        compile_memory_mb: int
        job_time_s: float | None
        wall_cap_s: float  # the most real time a case may take: wall_time_s stretched
        compile_cap_s: float  # the same for the compile
        cpus: float  # the container's CPUs

    class ValueCase(TypedDict):
        """``api.ValueCase``, its values as the codec's tokens."""

        args: list[Any] | None  # the arguments' list
        expected: list[Any]
        message: str | None
        compare: Literal["==", "is", "close"]
        tolerance: float

    class Values(TypedDict):
        target: str  # the program's name the cases call
        cases: list[ValueCase]

    class JudgeSpec(TypedDict):
        """``api.JudgeSpec``: the tests, as code and, where they are plain values, as data."""

        setup: str
        tests: list[str]
        test_names: list[str]
        pytest: bool
        values: Values | None

    class _Job(TypedDict):
        program: str
        language: str
        limits: Limits

    @final
    class CallJob(_Job):
        judge: JudgeSpec

    @final
    class IoJob(_Job):
        stdin_cases: list[str]
        files: dict[str, str]  # path -> base64
        fetch_files: list[str]
        stop_at_failure: bool

    Job = CallJob | IoJob

    @final
    class Ping(TypedDict):
        op: Literal["ping"]
        id: NotRequired[int]  # the reply's, so the host can tell it from another's

    @final
    class Run(TypedDict):
        op: Literal["run"]
        job: Job
        id: NotRequired[int]

    Request = Ping | Run

    @final
    class Heartbeat(TypedDict):
        """Sent every second while a job runs: a silent container is a paused or frozen one."""

        heartbeat: Literal[True]

    @final
    class Pong(TypedDict):
        pong: Literal[True]
        runner: str  # its ``source_version``: the host refuses an image of other runner code
        socket: NotRequired[str]  # where it listens for the host, on its first pong
        id: NotRequired[int | None]

    @final
    class Failure(TypedDict):
        """The supervisor's own failure: the host replaces the container and retries."""

        internal_error: str
        id: NotRequired[int | None]

    class TestResult(TypedDict):
        """``api.TestOutcome``."""

        name: str
        passed: bool
        error: str | None
        candidate_error: bool
        duration_s: float

    class _ProcessResult(TypedDict):
        status: str
        stdout: str
        stderr: str
        exit_code: int | None
        duration_s: float

    class CompileResult(_ProcessResult):
        """``api.CompileOutcome``."""

    class CaseResult(_ProcessResult):
        """``api.CaseOutcome``."""

        files: dict[str, str]  # path -> base64

    @final
    class Result(TypedDict):
        """A job's ``api.ExecutionResult``, and how many processes the sweep after it found
        alive (the host replaces a container that kept any)."""

        status: str
        error: NotRequired[str]
        duration_s: float
        leftover_processes: int
        tests: NotRequired[list[TestResult]]  # call jobs
        stdout: NotRequired[str]  # call jobs: the program's, its first 4 KiB
        stderr: NotRequired[str]
        cases: NotRequired[list[CaseResult]]  # io jobs
        compile: NotRequired[CompileResult]  # a compiled language's
        id: NotRequired[int | None]
