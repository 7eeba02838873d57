"""Call jobs: the program is loaded in one process and the job's tests call into it from another.

A call job's tests run in a judge, forked for the job from the judge zygote under the judge
user (``judge.run_job``): it reaches the program through the RPC and reports each test's
outcome on a pipe of its own. A value job's tests (``JudgeSpec.values``) are plain values, so
they need no judge: the program runs their calls on its own and exits (``run_values``), and its
replies are decided by the judge's own code (``judge.run_values`` over a ``judge.Replay``),
here where that is cheap and leaves nothing behind, else in a decider process of the judge
user that dies with the job (``judge.cheap_to_decide``). Replies too large to read here send
the job to a judge after all, which runs it again.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from typing import TYPE_CHECKING, Any

from . import judge
from .pump import (
    EXCERPT_BYTES,
    Deadline,
    ExitInfo,
    Pipes,
    SetupFailed,
    excerpt,
    how_it_ended,
    oom_kills,
    signal_verdict,
)
from .wire import complete_frames, frame

if TYPE_CHECKING:
    from .supervisor import Supervisor
    from .wire import CallJob, Limits, Result, Rlimits, Values

REPLY_BYTES = 1 << 20  # value tests: the most reply bytes read here; past it, the judge decides
JUDGE_GRACE_S = 1.0  # after a timeout, how long the judge may take to wind down
JUDGE_MEMORY_MB = 1024  # the judge's address space
JUDGE_PROCESSES = 4  # threads and processes a judge may have at once


def judge_limits(limits: Limits) -> Rlimits:
    """A job's judge's rlimits: its memory, its threads and processes, at most as much CPU as
    the job has real time (a thread it leaves spinning cannot outlast the job either: the judge
    dies with it), and files of 1 MB at most."""
    real_s = limits["wall_cap_s"]
    if limits["job_time_s"] is not None:
        real_s = min(real_s, limits["job_time_s"])
    return {
        "memory_mb": JUDGE_MEMORY_MB,
        "cpu_time_s": real_s + JUDGE_GRACE_S,
        "processes": JUDGE_PROCESSES,
        "disk_mb": 1,
    }


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a call job's processes ended: with its tests' events, what its verdict is read from."""

    # The limit that stopped it ("timeout", "output_limit"), or how deciding the program's
    # replies failed ("memory_limit", "runtime_error").
    outcome: str | None
    deadline: Deadline  # the one it ran under, which says what its time-out was
    candidate: ExitInfo | None  # how the program's process ended (None: it was still running)
    judge: str  # how the judge ended, or what stood for it
    oom: bool  # the container killed something for memory meanwhile
    leftover_processes: int  # what the sweep after it found alive


def run_call(supervisor: Supervisor, job: CallJob) -> Result:
    """The program and a judge for its tests, until the judge reports its last test."""
    limits = job["limits"]
    started = time.monotonic()
    oom_before = oom_kills()
    program = supervisor.spawn_program(limits)
    results_r, results_w = os.pipe()
    job_r, job_w = os.pipe()
    devnull = os.open("/dev/null", os.O_RDWR)
    judge_pid, judge_ready_r = supervisor.spawn(
        "judge",
        judge_limits(limits),
        [devnull, devnull, devnull, job_r, program.requests, program.replies, results_w],
        pytest=job["judge"]["pytest"],
    )
    for fd in (devnull, program.requests, program.replies, results_w, job_r):
        os.close(fd)
    pipes = Pipes()
    stdout, stderr = pipes.read(program.stdout), pipes.read(program.stderr)
    results, ready = pipes.read(results_r), pipes.read(program.ready)
    judge_ready = pipes.read(judge_ready_r)
    pipes.feed(job_w, frame(job))
    pipes.bound("output_limit", limits["output_bytes"], program.stdout, program.stderr)
    pids = (program.pid, judge_pid)
    deadline = Deadline(limits["wall_time_s"], limits, pids, started, supervisor.job_time)
    pump = supervisor.pump
    outcome = pump.run(pipes, deadline, until=lambda: pipes.closed(results_r))
    if outcome:  # stop the program and all it started, then let the judge wind down
        supervisor.stop_program(program.pid)
        grace = pipes.alone(results_r)
        pump.run(grace, Deadline(JUDGE_GRACE_S), until=grace.all_closed)
    events = complete_frames(results)
    if any(e.get("crashed") for e in events):
        pump.wait_exit(program.pid, 1.0)  # it died: learn how before deciding the status
    candidate_exit = pump.exited.get(program.pid)
    setup_failed = not outcome and not (ready and judge_ready)
    if setup_failed or not any(e.get("event") == "done" for e in events):
        pump.wait_exit(judge_pid, 1.0)
        pump.wait_exit(program.pid, 1.0)
    judge_exit = pump.exited.get(judge_pid)
    leftover = supervisor.finish(*pids)
    pipes.close()
    if setup_failed:
        raise SetupFailed(excerpt(stderr) or "a process of the job died in set-up")
    ending = Ending(
        outcome,
        deadline,
        candidate_exit,
        how_it_ended(judge_exit, "judge"),
        oom_kills() > oom_before,
        leftover,
    )
    return call_result(events, ending, (stdout, stderr), limits, started)


def run_values(supervisor: Supervisor, job: CallJob, values: Values) -> Result | None:
    """The job's ``values`` with no judge process: the candidate runs their script on its own
    (the target's lookup, a call per case) and exits; its replies are then decided by the
    judge's code. None when the replies were too large to read here: the judge decides then."""
    limits = job["limits"]
    started = time.monotonic()
    oom_before = oom_kills()
    program = supervisor.spawn_program(limits)
    pipes = Pipes()
    stdout, stderr = pipes.read(program.stdout), pipes.read(program.stderr)
    ready = pipes.read(program.ready, polled=True)
    try:  # the replies wait in the pipe until the program ends: all of them fit
        fcntl.fcntl(program.replies, fcntl.F_SETPIPE_SZ, REPLY_BYTES)
        replies = pipes.read(program.replies, polled=True)
    except OSError:  # over the user's pipe quota: read them as they come
        replies = pipes.read(program.replies)
    script = frame({"op": "load", "program": job["program"]}) + frame(
        {
            "op": "cases",
            "name": values["target"],
            "calls": [case["args"] for case in values["cases"] if case["args"] is not None],
        }
    )
    pipes.feed(program.requests, script)
    pipes.bound("output_limit", limits["output_bytes"], program.stdout, program.stderr)
    pipes.bound("capped", REPLY_BYTES, program.replies)
    deadline = Deadline(limits["wall_time_s"], limits, (program.pid,), started, supervisor.job_time)
    outcome = supervisor.pump.run(
        pipes, deadline, until=lambda: program.pid in supervisor.pump.exited
    )
    if outcome:
        supervisor.stop_program(program.pid)
    pipes.drain(pipes.buffers)  # what the candidate wrote before it ended
    outcome = outcome or pipes.over()
    candidate_exit = supervisor.pump.exited.get(program.pid)
    leftover = supervisor.finish(program.pid)
    pipes.close()
    if len(replies) > REPLY_BYTES:
        return None
    if not outcome and not ready:
        raise SetupFailed(excerpt(stderr) or "a process of the job died in set-up")
    events: list[dict[str, Any]] = []
    ending = Ending(
        outcome,
        deadline,
        candidate_exit,
        "no judge process: value tests",
        oom_kills() > oom_before,
        leftover,
    )
    parsed = judge.read_replies(replies)
    if judge.cheap_to_decide(parsed):
        judge.run_values(job, judge.Replay(parsed), events.append)
    else:
        events, ending = decide_values(supervisor, job, replies, ending)
    return call_result(events, ending, (stdout, stderr), limits, started)


def decide_values(
    supervisor: Supervisor, job: CallJob, replies: bytearray, ending: Ending
) -> tuple[list[dict[str, Any]], Ending]:
    """Decide value tests whose replies are costly to rebuild in a process of the judge user
    (``judge.decide_values``), under a judge's limits and the job's wall time again; the
    supervisor keeps beating meanwhile. Returns its test events, and how the job ended: as the
    program's run did, or, where the decider could not decide, as the decider did (the
    program's verdict: only its replies can make deciding them costly)."""
    limits = job["limits"]
    started = time.monotonic()
    oom_before = oom_kills()
    job_r, job_w = os.pipe()
    results_r, results_w = os.pipe()
    devnull = os.open("/dev/null", os.O_RDWR)
    decider, ready_r = supervisor.spawn(
        "values", judge_limits(limits), [devnull, devnull, devnull, job_r, results_w]
    )
    for fd in (devnull, job_r, results_w):
        os.close(fd)
    pipes = Pipes()
    results, ready = pipes.read(results_r), pipes.read(ready_r)
    pipes.feed(job_w, frame(job) + replies)
    deadline = Deadline(limits["wall_time_s"], limits, (decider,), started, supervisor.job_time)
    outcome = supervisor.pump.run(pipes, deadline, until=lambda: pipes.closed(results_r))
    supervisor.pump.wait_exit(decider, 0 if outcome else 1.0)
    decider_exit = supervisor.pump.exited.get(decider)
    leftover = max(ending.leftover_processes, supervisor.finish(decider))
    pipes.close()
    events = complete_frames(results)
    if not outcome and not ready:
        raise SetupFailed("the value tests' decider died in set-up")
    if any(e.get("event") == "done" for e in events):
        return events, dataclasses.replace(ending, leftover_processes=leftover)
    if not outcome:
        outcome = "memory_limit" if oom_kills() > oom_before else "runtime_error"
    how = f"deciding the program's results: {how_it_ended(decider_exit, 'decider')}"
    return events, dataclasses.replace(
        ending, outcome=outcome, deadline=deadline, judge=how, leftover_processes=leftover
    )


def call_result(
    events: list[dict[str, Any]],
    ending: Ending,
    output: tuple[bytearray, bytearray],
    limits: Limits,
    started: float,
) -> Result:
    """A call job's result from its test events and how its processes ended."""
    tests = [e for e in events if e.get("event") == "test"]
    load_error = next((e for e in events if e.get("event") == "load_error"), None)
    judge_error = next((e for e in events if e.get("event") == "judge_error"), None)
    done = any(e.get("event") == "done" for e in events)
    result: Result = {
        "status": "completed",
        "tests": [
            {
                "name": e["name"],
                "passed": e["passed"],
                "error": e["error"],
                "candidate_error": e["candidate_error"],
                "duration_s": e["duration_s"],
            }
            for e in tests
        ],
        "stdout": excerpt(output[0]),
        "stderr": excerpt(output[1]),
        "duration_s": time.monotonic() - started,
        "leftover_processes": ending.leftover_processes,
    }
    verdict = signal_verdict(ending.candidate, limits, ending.oom)
    if ending.outcome == "output_limit":
        status, error = "output_limit", f"output exceeded {limits['output_bytes']} bytes"
    elif ending.outcome == "timeout":
        status, error = "timeout", ending.deadline.describe()
    elif ending.outcome in ("memory_limit", "runtime_error"):  # deciding the program's replies
        status, error = ending.outcome, ending.judge
    elif load_error is not None:
        status = verdict[0] if verdict and load_error["crashed"] else load_error["kind"]
        error = load_error["message"][-2000:]
        result["stderr"] = (result["stderr"] + load_error["message"])[-EXCERPT_BYTES:]
    elif judge_error is not None or not done:
        # The tests could not run to their end (a caller's test code that kills or exits
        # its judge): no verdict, and nothing the container must be replaced for.
        why = judge_error["message"] if judge_error else ending.judge
        status, error = "sandbox_error", f"the judge gave no verdict: {why}"
    elif any(e.get("memory_error") for e in tests):
        status, error = "memory_limit", "MemoryError in the program"
    elif verdict:
        status, error = verdict
    else:
        return result
    result["status"], result["error"] = status, error
    return result
