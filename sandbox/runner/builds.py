"""A compiled language's program, compiled once per job and kept where no program can change it.

The compiler runs as the sandbox user, under the job's compile limits and the same isolation as
a run (``Supervisor.run_process``); the supervisor copies what it wrote into
``languages.BUILDS_DIR``, root's, read-only to every program, and empties that directory after
the job, so the next job starts from the same state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import time
from typing import TYPE_CHECKING

from . import languages
from .pump import excerpt
from .wire import frame

if TYPE_CHECKING:
    from .supervisor import Ran, Supervisor
    from .wire import CompileResult, IoJob, Limits


class BuildTooLarge(Exception):
    """What a compiler wrote is over the job's file size limit or does not fit in BUILDS_DIR."""


@dataclasses.dataclass(frozen=True)
class Build:
    """A job's compile: how it went, and where what the compiler wrote is kept."""

    result: CompileResult
    output: str | None  # the directory of root's holding it; None when it did not compile
    reason: str  # why it did not
    leftover_processes: int  # what the sweep after it found alive


class Builds:
    """This job's compiles, by a hash of the language, the source and the job's files: a
    program is compiled once per job whatever asks for it."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.done: dict[str, Build] = {}

    def get(self, language: languages.Language, job: IoJob) -> Build:
        key = hashlib.sha256(
            json.dumps([language.name, job["program"], job["files"]], sort_keys=True).encode()
        ).hexdigest()[:32]
        if key not in self.done:
            self.done[key] = self.compile(language, job, f"{languages.BUILDS_DIR}/{key}")
        return self.done[key]

    def compile(self, language: languages.Language, job: IoJob, target: str) -> Build:
        """Run the compiler as the sandbox user under the job's compile limits (its time, its
        memory; the job's processes, file size and output bounds), then keep what it wrote."""
        job_limits = job["limits"]
        limits: Limits = {
            **job_limits,
            "wall_time_s": job_limits["compile_time_s"],
            # A backstop: the wall limit always ends a compile first (a compiler never sleeps,
            # and its wall limit stops counting only while it waits for a CPU), so that the
            # time-out is seen as one rather than as the driver's report of a killed child.
            "cpu_time_s": job_limits["compile_cap_s"] + 1,
            "memory_mb": job_limits["compile_memory_mb"],
            "wall_cap_s": job_limits["compile_cap_s"],
        }
        started = time.monotonic()
        request = {
            "language": language.name,
            "program": job["program"],
            "files": job["files"],
            "memory_mb": limits["memory_mb"],
        }

        def judge_and_keep(ran: Ran) -> tuple[str, int | None, str]:
            status, exit_code, reason = _compile_status(language, ran, limits)
            if status == "completed":
                try:
                    keep_build(languages.OUTPUT_DIR, target, limits["disk_mb"] << 20)
                except BuildTooLarge as exc:
                    status, reason = "compile_error", str(exc)
            return status, exit_code, reason

        ran, (status, exit_code, reason), leftover = self.supervisor.run_process(
            "compile",
            limits,
            frame(request),
            b"",
            limits["output_bytes"],
            judge_and_keep,
            never_sleeps=True,
        )
        prepared = ran.prepared[0] if ran.prepared and "error" in ran.prepared[0] else None
        result: CompileResult = {
            "status": status,
            "stdout": excerpt(ran.stdout),
            "stderr": (prepared["message"] if prepared else "") + excerpt(ran.stderr),
            "exit_code": exit_code,
            "duration_s": time.monotonic() - started,
        }
        return Build(result, target if status == "completed" else None, reason, leftover)

    def clear(self) -> None:
        """What this job compiled goes with it: the next job starts from the same state."""
        self.done.clear()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(languages.BUILDS_DIR):
                shutil.rmtree(os.path.join(languages.BUILDS_DIR, name))


def keep_build(source: str, target: str, budget: int) -> None:
    """Copy what a compiler wrote (``source``, the sandbox user's) into ``target``, root's and
    read-only to every program: regular files and directories only, at most ``budget`` bytes.
    Nothing but the (trusted) compiler ran as the sandbox user since the last sweep, so the
    tree holds what it wrote."""
    os.mkdir(target, 0o711)
    pending = [(source, target)]
    while pending:
        here, there = pending.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                destination = os.path.join(there, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    os.mkdir(destination, 0o711)
                    pending.append((entry.path, destination))
                elif entry.is_file(follow_symlinks=False):
                    executable = entry.stat(follow_symlinks=False).st_mode & 0o111
                    budget -= _copy_file(
                        entry.path, destination, 0o555 if executable else 0o444, budget
                    )


def _copy_file(source: str, target: str, mode: int, budget: int) -> int:
    """Copy one file of at most ``budget`` bytes; returns its size."""
    size = 0
    with (
        open(os.open(source, os.O_RDONLY | os.O_NOFOLLOW), "rb") as reader,
        open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as writer,
    ):
        while chunk := reader.read(1 << 20):
            size += len(chunk)
            if size > budget:
                raise BuildTooLarge(f"the compiled program is over {budget} bytes")
            try:
                writer.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                raise BuildTooLarge("the compiled program does not fit in the sandbox") from None
    return size


def _first_error(message: str) -> str:
    """The compiler's first line that names an error (or its first line)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")


def _compile_status(
    language: languages.Language, ran: Ran, limits: Limits
) -> tuple[str, int | None, str]:
    """How a compile ended (completed, compile_error or the limit it hit), its exit code and
    why it failed."""
    if ran.outcome == "timeout":
        return "timeout", None, f"compile time over {limits['compile_time_s']} s"
    if ran.outcome == "output_limit":
        return "output_limit", None, f"compiler output over {limits['output_bytes']} bytes"
    if ran.prepared and "error" in ran.prepared[0]:  # the job's files could not be written
        return "compile_error", None, ran.prepared[0]["message"].strip()
    if ran.exit_info is None:
        raise RuntimeError("the compiler's exit was not seen")
    exit_code = os.waitstatus_to_exitcode(ran.exit_info[0])
    if language.ran_out_of_memory(ran.stderr) or (os.WIFSIGNALED(ran.exit_info[0]) and ran.oom):
        return "memory_limit", exit_code, f"compiler out of memory ({limits['memory_mb']} MB)"
    if exit_code != 0:
        reason = _first_error(excerpt(ran.stderr)) or f"exit status {exit_code}"
        return "compile_error", exit_code, reason
    return "completed", 0, ""
