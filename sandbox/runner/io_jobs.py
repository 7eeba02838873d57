"""io jobs: the program runs once per stdin case, as ``python3 program.py`` (or its compiled
binary) runs, and what it writes comes back; the caller compares it outside the sandbox.

Each case is a fresh process of the sandbox user (``Supervisor.run_process``) that starts with
the job's ``files`` in /work and ends with the ``fetch_files`` read back, by another fresh
process of that user, before the sweep empties the directory. ``output_bytes`` bounds the
output of all cases together, and ``job_time_s`` their time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING

from . import languages
from .pump import EXIT_GRACE_S, Deadline, Pipes, excerpt, signal_verdict
from .wire import complete_frames, frame

if TYPE_CHECKING:
    from .supervisor import Supervisor
    from .wire import CaseResult, IoJob, Limits, Result

FETCH_S = 5.0  # how long reading the files a job asked for may take
HELD_NOTE = (
    f"\n[sandbox] processes the program left were still holding stdout/stderr {EXIT_GRACE_S} s "
    "after it exited: they were killed, and anything they would have written later is not "
    "part of the output\n"
)


def run_io(supervisor: Supervisor, job: IoJob) -> Result:
    """Every case in turn, until one that stops the rest (a syntax error, the output limit,
    the job's time; any failure with ``stop_at_failure``). A compiled language's program is
    compiled first; one that does not compile runs no case."""
    limits = job["limits"]
    started = time.monotonic()
    language = languages.get(job["language"])
    build = supervisor.builds.get(language, job) if language.compiled else None
    leftover = 0 if build is None else build.leftover_processes
    if build is not None and build.output is None:
        return {
            "compile": build.result,
            "status": "compile_error",
            "error": f"did not compile: {build.reason}",
            "cases": [],
            "duration_s": time.monotonic() - started,
            "leftover_processes": leftover,
        }
    cases: list[CaseResult] = []
    budget = limits["output_bytes"]
    program = frame(
        {
            "program": job["program"],
            "files": job["files"],
            "language": language.name,
            "output": None if build is None else build.output,
            "memory_mb": limits["memory_mb"],
        }
    )
    for stdin_text in job["stdin_cases"]:
        case, used, left = run_case(supervisor, language, program, stdin_text.encode(), budget, job)
        leftover = max(leftover, left)
        budget -= used
        cases.append(case)
        if case["status"] in ("syntax_error", "output_limit") or supervisor.job_time.spent():
            break
        if case["status"] != "completed" and job["stop_at_failure"]:
            break
    syntax = bool(cases) and cases[-1]["status"] == "syntax_error"
    result: Result = {
        "status": "syntax_error" if syntax else "completed",
        "cases": cases,
        "duration_s": time.monotonic() - started,
        "leftover_processes": leftover,
    }
    if build is not None:
        result["compile"] = build.result
    return result


def run_case(
    supervisor: Supervisor,
    language: languages.Language,
    program: bytes,
    stdin: bytes,
    budget: int,
    job: IoJob,
) -> tuple[CaseResult, int, int]:
    """One io case, the output bytes it used and the processes its clean-up found left."""
    limits, fetch = job["limits"], job["fetch_files"]
    case_started = time.monotonic()
    # the address space its runtime reserves beyond the memory limit (V8's)
    reserving: Limits = {**limits, "memory_mb": limits["memory_mb"] + language.reserved_mb}
    ran, (files, files_note), leftover = supervisor.run_process(
        "io",
        reserving,
        program,
        stdin,
        budget,
        lambda _: fetch_files(supervisor, fetch, limits) if fetch else ({}, ""),
    )
    status, exit_code, load_error = "completed", None, ""
    if ran.outcome:
        status = ran.outcome
    elif ran.prepared and "error" in ran.prepared[0]:  # it did not compile, or no files
        status, load_error = ran.prepared[0]["error"], ran.prepared[0]["message"]
    elif ran.exit_info is not None:
        exit_code = os.waitstatus_to_exitcode(ran.exit_info[0])
        verdict = signal_verdict(ran.exit_info, limits, ran.oom)
        if verdict:
            status = verdict[0]
        elif exit_code != 0:
            status = "runtime_error"
        if status == "runtime_error" and language.ran_out_of_memory(ran.stderr):
            status = "memory_limit"
    job_time = supervisor.job_time
    spent = status == "timeout" and job_time.spent()
    case: CaseResult = {
        "status": status,
        "stdout": ran.stdout[: max(budget, 0)].decode("utf-8", "replace"),
        "stderr": load_error
        + excerpt(ran.stderr)
        + (HELD_NOTE if ran.held else "")
        + (f"\n[sandbox] {job_time.describe()}: no further case runs\n" if spent else "")
        + files_note,
        "exit_code": exit_code,
        "duration_s": time.monotonic() - case_started,
        "files": files,
    }
    return case, len(ran.stdout) + len(ran.stderr), leftover


def fetch_files(
    supervisor: Supervisor, paths: list[str], limits: Limits
) -> tuple[dict[str, str], str]:
    """The files ``paths`` the program left in /work, base64, at most ``output_bytes`` in
    all, read by a fresh process of the sandbox user (``candidate.fetch_files``); and a note
    for the case's stderr naming what was left out."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    devnull = os.open("/dev/null", os.O_RDWR)
    fetcher, ready_r = supervisor.spawn(
        "fetch", limits, [devnull, devnull, devnull, request_r, reply_w]
    )
    for fd in (devnull, request_r, reply_w):
        os.close(fd)
    budget = limits["output_bytes"]
    pipes = Pipes()
    reply = pipes.read(reply_r)
    pipes.read(ready_r)
    pipes.feed(request_w, frame({"paths": paths, "budget": budget}))
    pipes.bound("output_limit", 2 * budget + 65536, reply_r)  # base64 and JSON around `budget`
    if supervisor.pump.run(pipes, Deadline(FETCH_S), until=lambda: pipes.closed(reply_r)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(fetcher, signal.SIGKILL)
    supervisor.pump.wait_exit(fetcher, 1.0)
    pipes.close()
    replies = complete_frames(reply)
    if not replies:
        return {}, f"\n[sandbox] fetch_files: the files could not be read within {FETCH_S} s\n"
    notes = [
        f"\n[sandbox] fetch_files: {why}, left out: {', '.join(paths)}\n"
        for why, paths in (
            ("not regular files", replies[0]["irregular"]),
            (f"over {budget} bytes in all", replies[0]["over"]),
        )
        if paths
    ]
    return replies[0]["files"], "".join(notes)
