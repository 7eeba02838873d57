"""The frame format between the host and the sandbox, read by one reader on both sides: the
host's over a real socket, as the supervisor's stream splits it (its own socket, or Docker's
attached stream with a header per chunk)."""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time

import pytest

from codepost.sandbox import Job, JudgeSpec, Limits, PoolConfig
from codepost.sandbox import pool as pool_module
from codepost.sandbox.runner.wire import (
    HEADER,
    ProtocolError,
    complete_frames,
    frame,
    split_frame,
)

MESSAGES = [{"heartbeat": True}, {"status": "completed", "stdout": "x" * 3000}, [1, 2], "é"]


def test_a_frame_is_found_only_once_all_of_it_is_there():
    data = frame({"a": 1}) + frame([2])
    first_end = len(frame({"a": 1}))
    for cut in range(first_end):
        assert split_frame(data[:cut]) is None
    assert split_frame(data[:first_end]) == ({"a": 1}, first_end)
    assert split_frame(data, first_end) == ([2], len(data))
    assert split_frame(data, len(data)) is None


def test_a_frame_over_the_limit_or_not_json_is_refused_and_none_is_for_a_trusted_peer():
    big = frame("x" * 100)
    with pytest.raises(ProtocolError, match="exceeds the 10 byte limit"):
        split_frame(big, max_bytes=10)
    assert split_frame(big, max_bytes=None) == ("x" * 100, len(big))
    with pytest.raises(ProtocolError, match="undecodable"):
        split_frame(HEADER.pack(3) + b"{no")


def test_complete_frames_are_those_written_before_the_writer_stopped():
    data = b"".join(frame(message) for message in MESSAGES)
    assert complete_frames(data) == MESSAGES
    assert complete_frames(data[:-1]) == MESSAGES[:-1]
    assert complete_frames(b"") == []


def docker_chunks(data: bytes, size: int) -> bytes:
    """``data`` as Docker's attached stream carries a container's stdout, ``size`` bytes a
    chunk, each behind its header, with a chunk of stderr between every two."""
    out = b""
    for start in range(0, len(data), size):
        chunk = data[start : start + size]
        out += struct.pack(">BxxxI", 1, len(chunk)) + chunk
        out += struct.pack(">BxxxI", 2, 5) + b"noise"
    return out


@pytest.mark.parametrize("demux", [False, True], ids=["socket", "attached stream"])
@pytest.mark.parametrize("size", [3, 65536])
def test_the_host_reads_the_supervisors_frames_however_the_stream_splits_them(demux, size):
    host, supervisor = socket.socketpair()
    container = object.__new__(pool_module._Container)
    container.sock, container.demux, container.payload = host, demux, bytearray()
    data = b"".join(frame(message) for message in MESSAGES)
    stream = docker_chunks(data, size) if demux else data

    def send() -> None:
        for start in range(0, len(stream), size):
            supervisor.sendall(stream[start : start + size])

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    try:
        assert [container._read_frame(deadline, 30.0) for _ in MESSAGES] == MESSAGES
    finally:
        sender.join()
        host.close()
        supervisor.close()
    assert container.payload == bytearray()


@pytest.mark.parametrize(
    "job",
    [
        Job(program="print(1)", stdin_cases=("",)),
        Job(program="def f(): return 1", judge=JudgeSpec(setup="", tests=("assert f() == 1",))),
    ],
    ids=["io", "call"],
)
def test_a_job_carries_every_limit_the_api_has(job):
    """The pool names each limit it sends: one added to ``api.Limits`` must reach the sandbox."""
    limits = Limits(
        wall_time_s=1.5,
        cpu_time_s=2.5,
        memory_mb=300,
        output_bytes=4000,
        processes=5,
        disk_mb=7,
        compile_time_s=3.5,
        compile_memory_mb=600,
        job_time_s=30.0,
    )
    payload = pool_module._job_payload(dataclasses.replace(job, limits=limits), PoolConfig())
    sent = payload["limits"]
    assert {field: sent[field] for field in dataclasses.asdict(Limits())} == dataclasses.asdict(
        limits
    )
