"""PID 1 of a sandbox container: takes jobs from the host, runs them, cleans up after each.

Processes inside the container:

    supervisor (PID 1, root with only SETUID/SETGID/KILL)   holds the jobs
    +-- zygote (root, a fresh interpreter started before any job was read)
    |       forks every sandbox-user process, so none can find a test in its memory
    +-- judge zygote (root, the same, with the judge's modules imported)
    |       forks one judge per call job
    +-- pytest judge zygote (the same with pytest imported, started by the first job that
    |       runs pytest), forks the judges of such jobs
    +-- judge (judge user, non-dumpable; one per call job)   runs the job's tests, dies with it
    |       (a job whose tests are plain values has none: ``calls.run_values``)
    +-- candidate (sandbox user; one per job or io case)     forked as a child of this process
    +-- compiler (sandbox user; once per job of a compiled language), forked the same way

After a job the supervisor kills the candidate and the judge; if any process of either user is
still alive or a writable directory is not empty, each zygote forks a sweeper as its user
which kills every process of that user in one ``kill(-1)`` (atomic against forks) and empties
the directories of that user's files, so nothing a program or a test leaves behind reaches
the next job. The directories belong to root (no job can change their mode, ACLs or extended
attributes), and each job starts with their times as the container started. What a job's
test code does to its judge (a patched function, a thread left running) dies with the judge:
each job's judge is a fresh fork of a zygote that never ran a job.

This module is the job loop and the zygotes' other end; the jobs are ``calls`` (call and value
jobs) and ``io_jobs``, a compiled language's program is ``builds``', and ``pump`` is where the
supervisor waits while they run. What the host sends and gets back is ``wire``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from . import HOST_SOCKET, calls, io_jobs, source_version
from .builds import Builds
from .pump import (
    HEARTBEAT_S,
    Deadline,
    ExitInfo,
    JobTime,
    Pipes,
    Pump,
    SetupFailed,
    excerpt,
    oom_kills,
)
from .wire import PeerClosed, complete_frames, read_frame, write_all, write_frame
from .zygote import JUDGE_MODES, WRITABLE_DIRS

if TYPE_CHECKING:
    from .wire import Failure, Job, Limits, Pong, Request, Result, Rlimits

CANDIDATE_UID = int(os.environ.get("CODEPOST_CANDIDATE_UID", "10001"))
JUDGE_UID = int(os.environ.get("CODEPOST_JUDGE_UID", "10002"))
ZYGOTE_UIDS = {"judge": JUDGE_UID, "candidate": CANDIDATE_UID}  # started first, swept in order
# glibc reserves 64 MB of address space per thread arena: under the program's RLIMIT_AS that
# would allow only a dozen threads. Read once at malloc start-up, so set for the zygote.
PROGRAM_ENV = {"MALLOC_ARENA_MAX": "2"}

T = TypeVar("T")


def _log(message: str) -> None:
    os.write(2, f"[supervisor] {message}\n".encode())


def _owned_by_a_job(pid: str) -> bool:
    """Whether process ``pid`` is a program's or a judge's (of the sandbox or the judge user)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1]) in (CANDIDATE_UID, JUDGE_UID)
    except OSError:
        pass
    return False


def _job_processes() -> int:
    return sum(1 for pid in os.listdir("/proc") if pid.isdigit() and _owned_by_a_job(pid))


def _dirs_clean() -> bool:
    try:
        return not any(os.listdir(path) for path in WRITABLE_DIRS)
    except OSError:  # the program made a directory unreadable: sweep it
        return False


@dataclasses.dataclass
class Ran:
    """One process of the sandbox user (an io case, a compiler), run to its end or stopped."""

    outcome: str | None  # the limit that ended it: "timeout", "output_limit"
    held: bool  # its children still held its output after it exited
    exit_info: ExitInfo | None  # when it exited
    oom: bool  # the container killed something for memory meanwhile
    stdout: bytearray
    stderr: bytearray
    prepared: list[dict[str, Any]]  # its set-up's report: ok, or the error that ended it


class Program(NamedTuple):
    """A call job's program process, and the ends of its pipes that are not its own."""

    pid: int
    ready: int  # its set-up report, to read
    stdout: int
    stderr: int
    requests: int  # to write
    replies: int  # to read


class Supervisor:
    """The host's jobs, one at a time, and the processes that run them: the zygotes that fork
    them, the pump that waits on them, the job's compiles and its time."""

    def __init__(self) -> None:
        self.pump = Pump()
        self.zygotes = {kind: self.start_zygote(kind) for kind in ZYGOTE_UIDS}
        self.dir_times = {path: os.stat(path) for path in WRITABLE_DIRS}
        self.builds = Builds(self)
        self.job_time = JobTime()  # the running job's whole time

    def handle(self, request: Request) -> Pong | Result:
        if request["op"] == "ping":
            return {"pong": True, "runner": source_version()}
        try:
            return self.run_job(request["job"])
        finally:
            self.builds.clear()

    def run_job(self, job: Job) -> Result:
        if "judge" not in job:
            self.start_job(job["limits"])
            return io_jobs.run_io(self, job)
        if job["judge"]["pytest"]:
            self.zygote("pytest")  # started, if this is the first, before the job's time starts
        self.start_job(job["limits"])
        values = job["judge"]["values"]
        if values is not None:
            result = calls.run_values(self, job, values)
            if result is not None:
                return result
            self.start_job(job["limits"])  # the judge decides after all: a fresh start
        return calls.run_call(self, job)

    def start_job(self, limits: Limits) -> None:
        """A job's start: the writable directories' times as the container started (writing in
        them or ``touch`` would otherwise tell the next program something; the sweep empties
        them), and its whole time from now."""
        for path, stat in self.dir_times.items():
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        self.job_time = JobTime.of(limits)

    # -- the zygotes

    def start_zygote(self, kind: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        uid = CANDIDATE_UID if kind == "candidate" else JUDGE_UID
        code = (
            "import sys; sys.path.insert(0, '/opt/codepost'); from runner.zygote import main; "
            f"main({theirs.fileno()}, {uid}, {kind!r})"
        )
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={**os.environ, **PROGRAM_ENV},
        )
        theirs.close()
        ours.settimeout(HEARTBEAT_S)
        while True:  # the host hears from this container while a zygote imports its modules
            try:
                ready = ours.recv(16)
                break
            except TimeoutError:
                self.pump.beat()
        ours.settimeout(None)
        if ready != b"ready":
            raise RuntimeError(f"the {kind} zygote did not start")
        return process, ours

    def zygote(self, kind: str) -> socket.socket:
        """The control socket of the ``kind`` zygote; the pytest judges' is started on the
        first job that needs it."""
        if kind not in self.zygotes:
            self.zygotes[kind] = self.start_zygote(kind)
        return self.zygotes[kind][1]

    def zygote_call(
        self, kind: str, request: dict[str, Any], fds: Sequence[int] = ()
    ) -> dict[str, Any]:
        control = self.zygote(kind)
        socket.send_fds(control, [json.dumps(request).encode()], list(fds))
        reply = control.recv(1 << 16)
        if not reply:
            self.zygotes[kind] = self.start_zygote(kind)
            raise RuntimeError(f"the {kind} zygote died")
        reply_message: dict[str, Any] = json.loads(reply)
        return reply_message

    def spawn(
        self, mode: str, limits: Rlimits, fds: list[int], *, pytest: bool = False
    ) -> tuple[int, int]:
        """Fork a process for ``mode`` (a judge, one that runs pytest with ``pytest``, a value
        tests' decider, or a process of the sandbox user: ``zygote.py``); returns its pid and
        the pipe its set-up reports on."""
        ready_r, ready_w = os.pipe()
        kind = ("pytest" if pytest else "judge") if mode in JUDGE_MODES else "candidate"
        try:
            reply = self.zygote_call(
                kind, {"op": "spawn", "mode": mode, "limits": limits}, [*fds, ready_w]
            )
        finally:
            os.close(ready_w)
        return reply["pid"], ready_r

    def spawn_program(self, limits: Limits) -> Program:
        """The program's process of a call job."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDWR)
        pid, ready_r = self.spawn("call", limits, [devnull, out_w, err_w, requests_r, replies_w])
        for fd in (devnull, out_w, err_w, requests_r, replies_w):
            os.close(fd)
        return Program(pid, ready_r, out_r, err_r, requests_w, replies_r)

    def stop_program(self, candidate: int) -> None:
        """At a limit: kill the candidate and everything it started, now."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(candidate, signal.SIGKILL)
        self.zygote_call("candidate", {"op": "sweep"})

    def finish(self, *pids: int) -> int:
        """Kill the job's processes (its program's, its judge) and everything they left; count
        what survived (should be 0)."""
        for pid in pids:
            if pid not in self.pump.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in pids:
            self.pump.wait_exit(pid, 2.0)
        self.pump.exited.clear()
        left = _job_processes()
        # Each user's sweeper removes only that user's files, and a directory of one may hold
        # files of the other: a few rounds empty any nesting a job can make in its time.
        for _ in range(3):
            if left == 0 and _dirs_clean():
                return 0
            for kind in ZYGOTE_UIDS:
                self.zygote_call(kind, {"op": "sweep"})
            for _ in range(20):
                self.pump.reap()
                left = _job_processes()
                if left == 0:
                    break
                time.sleep(0.005)
            self.pump.exited.clear()
        return left + (not _dirs_clean())

    def run_process(
        self,
        mode: str,
        limits: Limits,
        request: bytes,
        stdin: bytes,
        budget: int,
        before_sweep: Callable[[Ran], T],
        *,
        never_sleeps: bool = False,
    ) -> tuple[Ran, T, int]:
        """Fork a process of the sandbox user for ``mode``, hand it ``request`` and ``stdin``, and
        collect its output (at most ``budget`` bytes) until it exits or a limit stops it; then
        ``before_sweep(ran)``, while what it left is still there (the files it wrote); then the
        sweep. Returns what ran, what ``before_sweep`` returned and the processes the sweep found
        left. The wall limit does not count the time it waited for a CPU its neighbours held
        (``never_sleeps``: all the time the container got less than its share)."""
        started = time.monotonic()
        oom_before = oom_kills()
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        frame_r, frame_w = os.pipe()
        stat_r, stat_w = os.pipe()
        pid, ready_r = self.spawn(mode, limits, [in_r, out_w, err_w, frame_r, stat_w])
        for fd in (in_r, out_w, err_w, frame_r, stat_w):
            os.close(fd)
        with contextlib.suppress(BrokenPipeError):  # it died: its exit says how
            write_all(frame_w, request)  # the process reads it first thing
        os.close(frame_w)
        pids = None if never_sleeps else (pid,)
        deadline = Deadline(limits["wall_time_s"], limits, pids, started, self.job_time)
        pipes = Pipes()
        stdout, stderr, stat = pipes.read(out_r), pipes.read(err_r), pipes.read(stat_r)
        ready = pipes.read(ready_r)
        pipes.feed(in_w, stdin)
        pipes.bound("output_limit", budget, out_r, err_r)
        outcome = self.pump.run(pipes, deadline, until=lambda: pid in self.pump.exited)
        stopped, held = outcome is not None, False
        if not stopped:
            outcome, held = self.pump.after_exit(pipes, deadline)
        ran = Ran(
            outcome=outcome,
            held=held,
            exit_info=None if stopped else self.pump.exited.get(pid),
            oom=oom_kills() > oom_before,
            stdout=stdout,
            stderr=stderr,
            prepared=complete_frames(stat),
        )
        kept = before_sweep(ran)  # at a limit: what it left as it was then
        if stopped:
            self.stop_program(pid)
        setup_failed = not outcome and not ready
        leftover = self.finish(pid)
        pipes.close()
        if setup_failed:
            raise SetupFailed(excerpt(stderr) or f"the {mode} process died in set-up")
        return ran, kept, leftover


# -- the host's stream


def _listen_for_host() -> socket.socket | None:
    """A socket the host may connect to in place of the attached stdin and stdout, which
    dockerd and containerd's shim copy every frame of: a host on the engine's machine, as
    root, reaches it through ``/proc/<pid>/root``. In a directory of root's, and gone before
    any job runs (``_await_host``), so no program sees it."""
    try:
        os.mkdir(os.path.dirname(HOST_SOCKET), 0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        listener.bind(HOST_SOCKET)
        listener.listen(1)
    except OSError:
        listener.close()
        _forget_host_socket()
        return None
    return listener


def _await_host(listener: socket.socket) -> None:
    """Whichever comes first: the host's connection, which then carries the frames (as fds 0
    and 1), or its next frame on stdin (a host that cannot reach the socket)."""
    ready, _, _ = select.select([listener.fileno(), 0], [], [])
    if listener.fileno() in ready:
        connection, _ = listener.accept()
        os.dup2(connection.fileno(), 0)
        os.dup2(connection.fileno(), 1)
        connection.close()
    listener.close()
    _forget_host_socket()


def _forget_host_socket() -> None:
    with contextlib.suppress(OSError):
        os.unlink(HOST_SOCKET)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(HOST_SOCKET))


def main() -> None:
    supervisor = Supervisor()
    first = True
    while True:
        try:
            request: Request = read_frame(0)
        except PeerClosed:
            return
        reply: Pong | Result | Failure
        try:
            reply = supervisor.handle(request)
        except Exception as exc:  # an infrastructure failure: the host retries elsewhere
            _log(f"internal error: {exc!r}")
            reply = {"internal_error": repr(exc)}
        reply["id"] = request.get("id")
        listener = None
        if first and "pong" in reply:
            listener = _listen_for_host()
            if listener is not None:
                reply["socket"] = HOST_SOCKET
        write_frame(1, reply)
        if listener is not None:
            _await_host(listener)
        first = False
