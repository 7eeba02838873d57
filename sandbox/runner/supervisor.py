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
    |       (a job whose tests are plain values has none: ``run_values``)
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

A compiled language's program is compiled once per job (``Supervisor.build``, cached by a hash
of the language, the source and the job's files) by the sandbox user, under the job's compile
limits and the same isolation as a run; the supervisor copies what the compiler wrote into
``languages.BUILDS_DIR``, root's, where no program can change it, and empties that directory
after the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import HOST_SOCKET, judge, languages, source_version
from .wire import PeerClosed, complete_frames, frame, read_frame, write_all, write_frame
from .zygote import JUDGE_MODES, WRITABLE_DIRS

CANDIDATE_UID = int(os.environ.get("CODEPOST_CANDIDATE_UID", "10001"))
JUDGE_UID = int(os.environ.get("CODEPOST_JUDGE_UID", "10002"))
ZYGOTE_UIDS = {"judge": JUDGE_UID, "candidate": CANDIDATE_UID}  # started first, swept in order
EXCERPT_BYTES = 4096
REPLY_BYTES = 1 << 20  # value tests: the most reply bytes read here; past it, the judge decides
# Pipes read only when their writer ends: emptied this often meanwhile, so that a writer the
# pipe cannot hold waits this long at most.
UNWATCHED_S = 0.05
JUDGE_GRACE_S = 1.0  # after a timeout, how long the judge may take to wind down
JUDGE_MEMORY_MB = 1024  # the judge's address space
JUDGE_PROCESSES = 4  # threads and processes a judge may have at once
EXIT_GRACE_S = 1.0  # io: how long output still counts after the program's main process exits
FETCH_S = 5.0  # io: how long reading the files a job asked for may take
# While a job runs, the host hears from the supervisor at least this often, so a paused or
# frozen container is found by its silence long before the job's host deadline.
HEARTBEAT_S = 1.0
HELD_NOTE = (
    f"\n[sandbox] processes the program left were still holding stdout/stderr {EXIT_GRACE_S} s "
    "after it exited: they were killed, and anything they would have written later is not "
    "part of the output\n"
)
OOM_CONTROL = "/sys/fs/cgroup/memory/memory.oom_control"  # cgroup v1
OOM_EVENTS = "/sys/fs/cgroup/memory.events"  # cgroup v2
CPU_USAGE = "/sys/fs/cgroup/cpuacct/cpuacct.usage"  # cgroup v1, ns
CPU_STAT = "/sys/fs/cgroup/cpu.stat"  # cgroup v2, usage_usec
# glibc reserves 64 MB of address space per thread arena: under the program's RLIMIT_AS that
# would allow only a dozen threads. Read once at malloc start-up, so set for the zygote.
PROGRAM_ENV = {"MALLOC_ARENA_MAX": "2"}


def _log(message: str) -> None:
    os.write(2, f"[supervisor] {message}\n".encode())


def _drain(fd: int, buffer: bytearray) -> None:
    """What the pipe ``fd`` holds now (a pipe holds at most 1 MiB), without waiting for more."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        buffer += os.read(fd, 1 << 20)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):  # the reader died: the caller finds out how
        write_all(fd, data)


def _excerpt(data: bytes | bytearray) -> str:
    return bytes(data[:EXCERPT_BYTES]).decode("utf-8", "replace")


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


def oom_kills() -> int:
    """The container's count of processes killed for memory (0 where it cannot be read)."""
    for path in (OOM_CONTROL, OOM_EVENTS):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


def cpu_wait_s(pids: tuple[int, ...]) -> float:
    """Seconds the processes ``pids`` were ready to run but waited for a CPU (the longest wait
    of any thread of each), from ``/proc/<pid>/task/<tid>/schedstat``; 0 for one that is gone."""
    total = 0
    for pid in pids:
        waits = [0]
        with contextlib.suppress(OSError, ValueError, IndexError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    waits.append(int(f.read().split()[1]))
        total += max(waits)
    return total / 1e9


def container_cpu_s() -> float:
    """CPU seconds every process of the container has used together (0 if unknown)."""
    with contextlib.suppress(OSError, ValueError), open(CPU_USAGE) as f:
        return int(f.read()) / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError), open(CPU_STAT) as f:
        for line in f:
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    return 0.0


@dataclasses.dataclass(frozen=True)
class JobTime:
    """A whole job's real-time limit (``Limits.job_time_s``): when it ends, and how long it is."""

    ends: float = math.inf  # time.monotonic()
    limit_s: float | None = None

    @classmethod
    def of(cls, limits: dict[str, Any]) -> JobTime:
        limit = limits.get("job_time_s")
        return cls() if limit is None else cls(time.monotonic() + limit, limit)

    def spent(self) -> bool:
        return time.monotonic() >= self.ends

    def describe(self) -> str:
        return f"the job's time over {self.limit_s} s (compile and all cases together)"


class Deadline:
    """When a wall-time limit ends. Time that ``pids`` spent waiting for a CPU does not count
    as far as others held it: as far as the container got less than its ``cpus`` share (a
    program that keeps its own container busy with many processes gains nothing). Up to
    ``cap_s`` of real time in all, so a busy host cannot make an honest program time out; and
    never past the end of the whole ``job``'s time."""

    def __init__(
        self,
        limit_s: float,
        limits: dict[str, Any] | None = None,
        pids: tuple[int, ...] | None = (),
        started: float | None = None,
        job: JobTime | None = None,
    ) -> None:
        """``pids`` () counts no waiting; None counts the container's shortfall alone, for work
        that never sleeps (a compiler, whose processes come and go)."""
        self.started = time.monotonic() if started is None else started
        self.limit_s, self.pids = limit_s, pids
        self.cap_s = max(limit_s, (limits or {}).get("wall_cap_s", limit_s))
        self.cpus = (limits or {}).get("cpus", 1.0)
        self.base_wait, self.base_cpu = cpu_wait_s(pids or ()), container_cpu_s()
        self.waited = 0.0
        self.job = job or JobTime()
        self.end = min(self.started + limit_s, self.job.ends)

    def remaining(self) -> float:
        now = time.monotonic()
        if now >= self.end and self.pids != () and self.end < self.job.ends:
            shortfall = (now - self.started) * self.cpus - (container_cpu_s() - self.base_cpu)
            waited = shortfall
            if self.pids is not None:
                waited = min(cpu_wait_s(self.pids) - self.base_wait, shortfall)
            self.waited = max(self.waited, waited)
            own_end = self.started + min(self.limit_s + self.waited, self.cap_s)
            self.end = min(own_end, self.job.ends)
        return self.end - now

    def describe(self) -> str:
        if self.end >= self.job.ends:
            return self.job.describe()
        waited = f" (and {self.waited:.1f} s waiting for a CPU)" if self.waited >= 0.05 else ""
        return f"wall time over {self.limit_s} s{waited}"


T = TypeVar("T")


class BuildTooLarge(Exception):
    """What a compiler wrote is over the job's file size limit or does not fit in BUILDS_DIR."""


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
    language: languages.Language, ran: Ran, limits: dict[str, Any]
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
        reason = _first_error(_excerpt(ran.stderr)) or f"exit status {exit_code}"
        return "compile_error", exit_code, reason
    return "completed", 0, ""


@dataclasses.dataclass
class Ran:
    """One process of the sandbox user (an io case, a compiler), run to its end or stopped."""

    outcome: str | None  # the limit that ended it: "timeout", "output_limit"
    held: bool  # its children still held its output after it exited
    exit_info: tuple[int, float] | None  # wait status and CPU seconds, when it exited
    oom: bool  # the container killed something for memory meanwhile
    stdout: bytearray
    stderr: bytearray
    prepared: list[dict[str, Any]]  # its set-up's report: ok, or the error that ended it


class SetupFailed(RuntimeError):
    """The sandbox could not set up a program's process: the container is broken."""


def judge_limits(limits: dict[str, Any]) -> dict[str, Any]:
    """A job's judge's rlimits: its memory, its threads and processes, at most as much CPU as
    the job has real time (a thread it leaves spinning cannot outlast the job either: the judge
    dies with it), and files of 1 MB at most."""
    real_s = limits.get("wall_cap_s", limits["wall_time_s"])
    if limits.get("job_time_s") is not None:
        real_s = min(real_s, limits["job_time_s"])
    cpu_s = real_s + JUDGE_GRACE_S
    return {
        "memory_mb": JUDGE_MEMORY_MB,
        "cpu_time_s": cpu_s,
        "processes": JUDGE_PROCESSES,
        "disk_mb": 1,
    }


def _how_it_ended(exit_info: tuple[int, float] | None, name: str) -> str:
    if exit_info is None:
        return f"the {name} was still running"
    status = exit_info[0]
    if os.WIFSIGNALED(status):
        return f"the {name} was killed by {signal_name(os.WTERMSIG(status))}"
    return f"the {name} exited with status {os.waitstatus_to_exitcode(status)}"


def _signal_verdict(exit_info: tuple[int, float] | None, limits: dict[str, Any], oom: bool):
    """Map a death by signal to a status: CPU limit -> timeout, OOM kill -> memory_limit."""
    if exit_info is None or not os.WIFSIGNALED(exit_info[0]):
        return None
    sig, cpu_seconds = os.WTERMSIG(exit_info[0]), exit_info[1]
    if sig == signal.SIGXCPU or cpu_seconds >= limits["cpu_time_s"] - 0.05:
        return "timeout", f"CPU time over {limits['cpu_time_s']} s"
    if sig == signal.SIGKILL and oom:
        return "memory_limit", "killed by the memory limit"
    if sig == signal.SIGXFSZ:
        return "runtime_error", f"file size over {limits['disk_mb']} MB"
    return "runtime_error", f"killed by signal {signal_name(sig)}"


def signal_name(number: int) -> str:
    """``SIGSEGV``, or ``SIGRTMIN+3`` / ``signal 40`` for the ones ``signal.Signals`` lacks."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


class Supervisor:
    def __init__(self) -> None:
        self.exited: dict[int, tuple[int, float]] = {}  # pid -> (wait status, cpu seconds)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.last_beat = 0.0
        self.zygotes = {kind: self.start_zygote(kind) for kind in ZYGOTE_UIDS}
        self.dir_times = {path: os.stat(path) for path in WRITABLE_DIRS}
        self.builds: dict[str, dict[str, Any]] = {}  # this job's compiles, by source hash
        self.job_time = JobTime()  # the running job's whole time

    def beat(self) -> None:
        """A heartbeat frame to the host, at most every ``HEARTBEAT_S``."""
        now = time.monotonic()
        if now - self.last_beat >= HEARTBEAT_S:
            write_frame(1, {"heartbeat": True})
            self.last_beat = now

    def restore_dirs(self) -> None:
        """The writable directories' times as the container started: writing in them or
        ``touch`` would otherwise tell the next program something (the sweep empties them)."""
        for path, stat in self.dir_times.items():
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    # -- helper processes

    def start_zygote(self, kind: str) -> tuple[subprocess.Popen, socket.socket]:
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
                self.beat()
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
        self, kind: str, request: dict[str, Any], fds: list[int] = ()
    ) -> dict[str, Any]:
        control = self.zygote(kind)
        socket.send_fds(control, [json.dumps(request).encode()], list(fds))
        reply = control.recv(1 << 16)
        if not reply:
            self.zygotes[kind] = self.start_zygote(kind)
            raise RuntimeError(f"the {kind} zygote died")
        return json.loads(reply)

    # -- process bookkeeping

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exited[pid] = (status, usage.ru_utime + usage.ru_stime)

    def wait_exit(self, pid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while pid not in self.exited and time.monotonic() < deadline:
            self.reap()
            if pid not in self.exited:
                time.sleep(0.0002)

    def finish(self, *pids: int) -> int:
        """Kill the job's processes (its program's, its judge) and everything they left; count
        what survived (should be 0)."""
        for pid in pids:
            if pid not in self.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in pids:
            self.wait_exit(pid, 2.0)
        self.exited.clear()
        left = _job_processes()
        # Each user's sweeper removes only that user's files, and a directory of one may hold
        # files of the other: a few rounds empty any nesting a job can make in its time.
        for _ in range(3):
            if left == 0 and _dirs_clean():
                return 0
            for kind in ZYGOTE_UIDS:
                self.zygote_call(kind, {"op": "sweep"})
            for _ in range(20):
                self.reap()
                left = _job_processes()
                if left == 0:
                    break
                time.sleep(0.005)
            self.exited.clear()
        return left + (not _dirs_clean())

    def stop_program(self, candidate: int) -> None:
        """At a limit: kill the candidate and everything it started, now."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(candidate, signal.SIGKILL)
        self.zygote_call("candidate", {"op": "sweep"})

    def spawn(
        self, mode: str, limits: dict[str, Any], fds: list[int], *, pytest: bool = False
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

    def spawn_program(self, limits: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
        """The program's process of a call job: its pid, and the ends of its pipes that are
        not its own: set-up report, stdout and stderr (to read), requests (to write) and
        replies (to read)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDWR)
        pid, ready_r = self.spawn("call", limits, [devnull, out_w, err_w, requests_r, replies_w])
        for fd in (devnull, out_w, err_w, requests_r, replies_w):
            os.close(fd)
        return pid, ready_r, out_r, err_r, requests_w, replies_r

    # -- collecting output

    def collect(
        self,
        streams: dict[int, bytearray],
        deadline: Deadline,
        *,
        counted: tuple[int, ...] = (),
        limit: int = 0,
        until_closed: tuple[int, ...] = (),
        until_exit: int | None = None,
        feed: tuple[int, bytes] | None = None,
        capped: tuple[int, int] | None = None,
        unwatched: tuple[int, ...] = (),
    ) -> str | None:
        """Pump the pipes until every fd of ``until_closed`` hits EOF or ``until_exit`` exits.
        The ``unwatched`` ones are emptied every ``UNWATCHED_S`` only, not as each write
        arrives: a reply per call would wake this process, and stop the program, each time.

        Returns "timeout", "output_limit" when the ``counted`` streams hold more than
        ``limit`` bytes, or "capped" when the stream of ``capped``'s fd holds more than its
        bytes, when a limit ended it, else None.
        """
        selector = selectors.DefaultSelector()
        for fd in streams.keys() - set(unwatched):
            selector.register(fd, selectors.EVENT_READ)
        selector.register(self.wake_r, selectors.EVENT_READ)
        feed_fd, pending = (feed[0], memoryview(feed[1])) if feed else (None, memoryview(b""))
        if feed_fd is not None:
            os.set_blocking(feed_fd, False)
            selector.register(feed_fd, selectors.EVENT_WRITE)
        open_fds = set(streams)
        outcome = None
        next_drain = time.monotonic() + UNWATCHED_S
        try:
            while True:
                if until_closed and open_fds.isdisjoint(until_closed):
                    break
                if until_exit is not None and until_exit in self.exited:
                    break
                remaining = deadline.remaining()
                if remaining <= 0:
                    outcome = "timeout"
                    break
                self.beat()
                wait = min(remaining, HEARTBEAT_S)
                if unwatched:
                    if time.monotonic() >= next_drain:
                        for fd in unwatched:
                            _drain(fd, streams[fd])
                        next_drain = time.monotonic() + UNWATCHED_S
                    wait = min(wait, max(next_drain - time.monotonic(), 0.0))
                for key, _ in selector.select(wait):
                    fd = key.fd
                    if fd == self.wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(fd, 4096)
                        self.reap()
                    elif fd == feed_fd:
                        try:
                            pending = pending[os.write(fd, pending[: 1 << 16]) :]
                        except BrokenPipeError:
                            pending = pending[:0]
                        except BlockingIOError:
                            continue
                        if not pending:
                            selector.unregister(fd)
                            os.close(fd)
                            feed_fd = None
                    else:
                        chunk = os.read(fd, 1 << 16)
                        if chunk:
                            streams[fd] += chunk
                        else:
                            selector.unregister(fd)
                            open_fds.discard(fd)
                if sum(len(streams[fd]) for fd in counted) > limit:
                    outcome = "output_limit"
                    break
                if capped and len(streams[capped[0]]) > capped[1]:
                    outcome = "capped"
                    break
        finally:
            selector.close()
            if feed_fd is not None:
                os.close(feed_fd)
        return outcome

    def collect_after_exit(
        self,
        streams: dict[int, bytearray],
        deadline: Deadline,
        counted: tuple[int, int],
        limit: int,
    ) -> tuple[str | None, bool]:
        """After an io program exits: its output until every pipe closes, for at most
        ``EXIT_GRACE_S``, so a child that writes just after its parent exits still counts.

        Returns the limit hit (or None) and whether processes still held the pipes at the end.
        """
        end = Deadline(min(EXIT_GRACE_S, max(deadline.remaining(), 0.0)))
        outcome = self.collect(
            streams, end, counted=counted, limit=limit, until_closed=tuple(streams)
        )
        if outcome == "timeout":  # the program itself ended in time: only its children did not
            return None, True
        return outcome, False

    # -- the two job kinds

    def run_call(self, job: dict[str, Any]) -> dict[str, Any]:
        if job["judge"].get("values") is not None:
            result = self.run_values(job)
            if result is not None:
                return result
            self.restore_dirs()  # the judge decides after all: a fresh start, its own time
            self.job_time = JobTime.of(job["limits"])
        limits = job["limits"]
        started = time.monotonic()
        oom_before = oom_kills()
        candidate, ready_r, out_r, err_r, j2c_w, c2j_r = self.spawn_program(limits)
        res_r, res_w = os.pipe()
        job_r, job_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDWR)
        judge, judge_ready_r = self.spawn(
            "judge",
            judge_limits(limits),
            [devnull, devnull, devnull, job_r, j2c_w, c2j_r, res_w],
            pytest=bool(job["judge"].get("pytest")),
        )
        for fd in (devnull, j2c_w, c2j_r, res_w, job_r):
            os.close(fd)
        streams = {
            out_r: bytearray(),
            err_r: bytearray(),
            res_r: bytearray(),
            ready_r: bytearray(),
            judge_ready_r: bytearray(),
        }
        deadline = Deadline(
            limits["wall_time_s"], limits, (candidate, judge), started, self.job_time
        )
        outcome = self.collect(
            streams,
            deadline,
            counted=(out_r, err_r),
            limit=limits["output_bytes"],
            until_closed=(res_r,),
            feed=(job_w, frame(job)),
        )
        if outcome:  # stop the program and all it started, then let the judge wind down
            self.stop_program(candidate)
            self.collect({res_r: streams[res_r]}, Deadline(JUDGE_GRACE_S), until_closed=(res_r,))
        events = complete_frames(streams[res_r])
        if any(e.get("crashed") for e in events):
            self.wait_exit(candidate, 1.0)  # it died: learn how before deciding the status
        candidate_exit = self.exited.get(candidate)
        setup_failed = not outcome and not (streams[ready_r] and streams[judge_ready_r])
        done = any(e.get("event") == "done" for e in events)
        if setup_failed or not done:
            self.wait_exit(judge, 1.0)
            self.wait_exit(candidate, 1.0)
        judge_exit = self.exited.get(judge)
        leftover = self.finish(candidate, judge)
        for fd in streams:
            os.close(fd)
        if setup_failed:
            raise SetupFailed(_excerpt(streams[err_r]) or "a process of the job died in set-up")
        return self.call_result(
            events,
            outcome,
            deadline,
            (streams[out_r], streams[err_r]),
            candidate_exit,
            _how_it_ended(judge_exit, "judge"),
            limits,
            started=started,
            oom=oom_kills() > oom_before,
            leftover=leftover,
        )

    def run_values(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """Value tests (``JudgeSpec.values``) with no judge process: the candidate runs their
        script on its own (the target's lookup, a call per case) and exits; its replies are
        then decided by the judge's code (``judge.run_values`` over a ``judge.Replay``), here
        where that is cheap and leaves nothing behind, else in a decider process that dies
        with the job (``judge.cheap_to_decide``). None when the replies were too large to read
        here: the judge decides then."""
        limits = job["limits"]
        started = time.monotonic()
        oom_before = oom_kills()
        candidate, ready_r, out_r, err_r, req_w, rep_r = self.spawn_program(limits)
        streams = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray(), ready_r: bytearray()}
        try:  # the replies wait in the pipe until the program ends: all of them fit
            fcntl.fcntl(rep_r, fcntl.F_SETPIPE_SZ, REPLY_BYTES)
            unwatched: tuple[int, ...] = (ready_r, rep_r)
        except OSError:  # over the user's pipe quota: read them as they come
            unwatched = (ready_r,)
        values = job["judge"]["values"]
        script = frame({"op": "load", "program": job["program"]}) + frame(
            {
                "op": "cases",
                "name": values["target"],
                "calls": [case["args"] for case in values["cases"] if case["args"] is not None],
            }
        )
        deadline = Deadline(limits["wall_time_s"], limits, (candidate,), started, self.job_time)
        outcome = self.collect(
            streams,
            deadline,
            counted=(out_r, err_r),
            limit=limits["output_bytes"],
            until_exit=candidate,
            feed=(req_w, script),
            capped=(rep_r, REPLY_BYTES),
            unwatched=unwatched,
        )
        if outcome:
            self.stop_program(candidate)
        for fd in streams:  # what the candidate wrote before it ended
            _drain(fd, streams[fd])
        if not outcome and len(streams[out_r]) + len(streams[err_r]) > limits["output_bytes"]:
            outcome = "output_limit"
        if len(streams[rep_r]) > REPLY_BYTES:
            outcome = "capped"
        candidate_exit = self.exited.get(candidate)
        leftover = self.finish(candidate)
        for fd in streams:
            os.close(fd)
        if outcome == "capped":
            return None
        if not outcome and not streams[ready_r]:
            raise SetupFailed(_excerpt(streams[err_r]) or "a process of the job died in set-up")
        replies = judge.read_replies(streams[rep_r])
        events: list[dict[str, Any]] = []
        decided_by = "no judge process: value tests"
        if judge.cheap_to_decide(replies):
            judge.run_values(job, judge.Replay(replies), events.append)
        else:
            events, undecided, left = self.decide_values(job, streams[rep_r], limits)
            leftover = max(leftover, left)
            if undecided:
                outcome, deadline, decided_by = undecided
        return self.call_result(
            events,
            outcome,
            deadline,
            (streams[out_r], streams[err_r]),
            candidate_exit,
            decided_by,
            limits,
            started=started,
            oom=oom_kills() > oom_before,
            leftover=leftover,
        )

    def decide_values(
        self, job: dict[str, Any], replies: bytearray, limits: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], tuple[str, Deadline, str] | None, int]:
        """Decide value tests whose replies are costly to rebuild in a process of the judge
        user (``judge.decide_values``), under a judge's limits and the job's wall time again;
        the supervisor keeps beating meanwhile. Returns its test events; how it failed to decide
        (a limit, its deadline, how it ended), the program's verdict then, since only the
        program's replies can make deciding them costly; and the processes left."""
        started = time.monotonic()
        oom_before = oom_kills()
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDWR)
        decider, ready_r = self.spawn(
            "values", judge_limits(limits), [devnull, devnull, devnull, job_r, res_w]
        )
        for fd in (devnull, job_r, res_w):
            os.close(fd)
        streams = {res_r: bytearray(), ready_r: bytearray()}
        deadline = Deadline(limits["wall_time_s"], limits, (decider,), started, self.job_time)
        outcome = self.collect(
            streams, deadline, until_closed=(res_r,), feed=(job_w, frame(job) + replies)
        )
        self.wait_exit(decider, 0 if outcome else 1.0)
        decider_exit = self.exited.get(decider)
        leftover = self.finish(decider)
        for fd in streams:
            os.close(fd)
        events = complete_frames(streams[res_r])
        if not outcome and not streams[ready_r]:
            raise SetupFailed("the value tests' decider died in set-up")
        if any(e.get("event") == "done" for e in events):
            return events, None, leftover
        how = _how_it_ended(decider_exit, "decider")
        if not outcome:
            outcome = "memory_limit" if oom_kills() > oom_before else "runtime_error"
        return events, (outcome, deadline, f"deciding the program's results: {how}"), leftover

    def call_result(
        self,
        events: list[dict[str, Any]],
        outcome: str | None,
        deadline: Deadline,
        output: tuple[bytearray, bytearray],
        candidate_exit: tuple[int, float] | None,
        judge_ended: str,
        limits: dict[str, Any],
        *,
        started: float,
        oom: bool,
        leftover: int,
    ) -> dict[str, Any]:
        """A call job's result from its test events and how its processes ended."""
        tests = [e for e in events if e.get("event") == "test"]
        load_error = next((e for e in events if e.get("event") == "load_error"), None)
        judge_error = next((e for e in events if e.get("event") == "judge_error"), None)
        done = any(e.get("event") == "done" for e in events)
        result: dict[str, Any] = {
            "tests": [
                {k: e[k] for k in ("name", "passed", "error", "candidate_error", "duration_s")}
                for e in tests
            ],
            "stdout": _excerpt(output[0]),
            "stderr": _excerpt(output[1]),
            "duration_s": time.monotonic() - started,
            "leftover_processes": leftover,
        }
        verdict = _signal_verdict(candidate_exit, limits, oom)
        if outcome == "output_limit":
            result.update(
                status="output_limit", error=f"output exceeded {limits['output_bytes']} bytes"
            )
        elif outcome == "timeout":
            result.update(status="timeout", error=deadline.describe())
        elif outcome in ("memory_limit", "runtime_error"):  # deciding the program's replies
            result.update(status=outcome, error=judge_ended)
        elif load_error is not None:
            kind = verdict[0] if verdict and load_error["crashed"] else load_error["kind"]
            result.update(status=kind, error=load_error["message"][-2000:])
            result["stderr"] = (result["stderr"] + load_error["message"])[-EXCERPT_BYTES:]
        elif judge_error is not None or not done:
            # The tests could not run to their end (a caller's test code that kills or exits
            # its judge): no verdict, and nothing the container must be replaced for.
            why = judge_error["message"] if judge_error else judge_ended
            result.update(status="sandbox_error", error=f"the judge gave no verdict: {why}")
        elif any(e.get("memory_error") for e in tests):
            result.update(status="memory_limit", error="MemoryError in the program")
        elif verdict:
            result.update(status=verdict[0], error=verdict[1])
        else:
            result["status"] = "completed"
        return result

    # -- the compile phase of a compiled language

    def build(self, language: languages.Language, job: dict[str, Any]) -> dict[str, Any]:
        """The job's program compiled, once per job whatever asks for it: the compile's outcome
        (``status``, ``stdout``, ``stderr``, ``exit_code``, ``duration_s``) and ``output``, the
        directory of root's holding what the compiler wrote (None when it did not compile)."""
        files = job.get("files", {})
        key = hashlib.sha256(
            json.dumps([language.name, job["program"], files], sort_keys=True).encode()
        ).hexdigest()[:32]
        if key not in self.builds:
            self.builds[key] = self.compile(language, job, f"{languages.BUILDS_DIR}/{key}")
        return self.builds[key]

    def compile(
        self, language: languages.Language, job: dict[str, Any], target: str
    ) -> dict[str, Any]:
        """Run the compiler as the sandbox user under the job's compile limits (its time, its
        memory; the job's processes, file size and output bounds), then keep what it wrote."""
        job_limits = job["limits"]
        limits = {
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
            "files": job.get("files", {}),
        }

        def judge_and_keep(ran: Ran) -> tuple[str, int | None, str]:
            status, exit_code, reason = _compile_status(language, ran, limits)
            if status == "completed":
                try:
                    keep_build(languages.OUTPUT_DIR, target, limits["disk_mb"] << 20)
                except BuildTooLarge as exc:
                    status, reason = "compile_error", str(exc)
            return status, exit_code, reason

        ran, (status, exit_code, reason), leftover = self.run_process(
            "compile",
            limits,
            frame(request),
            b"",
            limits["output_bytes"],
            judge_and_keep,
            never_sleeps=True,
        )
        prepared = ran.prepared[0] if ran.prepared and "error" in ran.prepared[0] else None
        return {
            "status": status,
            "stdout": _excerpt(ran.stdout),
            "stderr": (prepared["message"] if prepared else "") + _excerpt(ran.stderr),
            "exit_code": exit_code,
            "duration_s": time.monotonic() - started,
            "output": target if status == "completed" else None,
            "reason": reason,
            "leftover_processes": leftover,
        }

    def clear_builds(self) -> None:
        """What this job compiled goes with it: the next job starts from the same state."""
        self.builds.clear()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(languages.BUILDS_DIR):
                shutil.rmtree(os.path.join(languages.BUILDS_DIR, name))

    def run_io(self, job: dict[str, Any]) -> dict[str, Any]:
        """One process per stdin case; ``output_bytes`` bounds the output of all cases together.

        Each case starts with the job's ``files`` in /work and ends with the ``fetch_files``
        read back (the working directory is emptied between cases). A compiled language's
        program is compiled first; one that does not compile runs no case."""
        limits = job["limits"]
        started = time.monotonic()
        language = languages.get(job["language"])
        build: dict[str, Any] = {"output": None, "leftover_processes": 0}
        reply: dict[str, Any] = {}
        if language.compiled:
            build = self.build(language, job)
            reply["compile"] = {
                k: build[k] for k in ("status", "stdout", "stderr", "exit_code", "duration_s")
            }
            if build["output"] is None:
                return {
                    **reply,
                    "status": "compile_error",
                    "error": f"did not compile: {build['reason']}",
                    "cases": [],
                    "duration_s": time.monotonic() - started,
                    "leftover_processes": build["leftover_processes"],
                }
        cases: list[dict[str, Any]] = []
        leftover = build["leftover_processes"]
        budget = limits["output_bytes"]
        program = frame(
            {
                "program": job["program"],
                "files": job.get("files", {}),
                "language": language.name,
                "output": build["output"],
            }
        )
        fetch = job.get("fetch_files", [])
        for stdin_text in job["stdin_cases"]:
            case, used, left = self.run_io_case(
                language, program, stdin_text.encode(), limits, budget, fetch
            )
            leftover = max(leftover, left)
            budget -= used
            cases.append(case)
            if case["status"] in ("syntax_error", "output_limit") or self.job_time.spent():
                break
            if case["status"] != "completed" and job.get("stop_at_failure"):
                break
        syntax = bool(cases) and cases[-1]["status"] == "syntax_error"
        return {
            **reply,
            "status": "syntax_error" if syntax else "completed",
            "cases": cases,
            "duration_s": time.monotonic() - started,
            "leftover_processes": leftover,
        }

    def run_io_case(
        self,
        language: languages.Language,
        program: bytes,
        stdin: bytes,
        limits: dict[str, Any],
        budget: int,
        fetch: list[str],
    ) -> tuple[dict[str, Any], int, int]:
        """One io case, the output bytes it used and the processes its clean-up found left."""
        case_started = time.monotonic()
        ran, (files, files_note), leftover = self.run_process(
            "io",
            limits,
            program,
            stdin,
            budget,
            lambda _: self.fetch_files(fetch, limits) if fetch else ({}, ""),
        )
        status, exit_code, load_error = "completed", None, ""
        if ran.outcome:
            status = ran.outcome
        elif ran.prepared and "error" in ran.prepared[0]:  # it did not compile, or no files
            status, load_error = ran.prepared[0]["error"], ran.prepared[0]["message"]
        elif ran.exit_info is not None:
            exit_code = os.waitstatus_to_exitcode(ran.exit_info[0])
            verdict = _signal_verdict(ran.exit_info, limits, ran.oom)
            if verdict:
                status = verdict[0]
            elif exit_code != 0:
                status = "runtime_error"
            if status == "runtime_error" and language.ran_out_of_memory(ran.stderr):
                status = "memory_limit"
        spent = status == "timeout" and self.job_time.spent()
        case = {
            "status": status,
            "stdout": ran.stdout[: max(budget, 0)].decode("utf-8", "replace"),
            "stderr": load_error
            + _excerpt(ran.stderr)
            + (HELD_NOTE if ran.held else "")
            + (f"\n[sandbox] {self.job_time.describe()}: no further case runs\n" if spent else "")
            + files_note,
            "exit_code": exit_code,
            "duration_s": time.monotonic() - case_started,
            "files": files,
        }
        return case, len(ran.stdout) + len(ran.stderr), leftover

    def run_process(
        self,
        mode: str,
        limits: dict[str, Any],
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
        _write_all(frame_w, request)  # the process reads it first thing
        os.close(frame_w)
        pids = None if never_sleeps else (pid,)
        deadline = Deadline(limits["wall_time_s"], limits, pids, started, self.job_time)
        streams = {
            out_r: bytearray(),
            err_r: bytearray(),
            stat_r: bytearray(),
            ready_r: bytearray(),
        }
        output = (out_r, err_r)
        outcome = self.collect(
            streams, deadline, counted=output, limit=budget, until_exit=pid, feed=(in_w, stdin)
        )
        stopped, held = outcome is not None, False
        if not stopped:
            outcome, held = self.collect_after_exit(streams, deadline, output, budget)
        ran = Ran(
            outcome=outcome,
            held=held,
            exit_info=None if stopped else self.exited.get(pid),
            oom=oom_kills() > oom_before,
            stdout=streams[out_r],
            stderr=streams[err_r],
            prepared=complete_frames(streams[stat_r]),
        )
        kept = before_sweep(ran)  # at a limit: what it left as it was then
        if stopped:
            self.stop_program(pid)
        setup_failed = not outcome and not streams[ready_r]
        leftover = self.finish(pid)
        for fd in streams:
            os.close(fd)
        if setup_failed:
            raise SetupFailed(_excerpt(streams[err_r]) or f"the {mode} process died in set-up")
        return ran, kept, leftover

    def fetch_files(self, paths: list[str], limits: dict[str, Any]) -> tuple[dict[str, str], str]:
        """The files ``paths`` the program left in /work, base64, at most ``output_bytes`` in
        all, read by a fresh process of the sandbox user (``candidate.fetch_files``); and a note
        for the case's stderr naming what was left out."""
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDWR)
        fetcher, ready_r = self.spawn(
            "fetch", limits, [devnull, devnull, devnull, request_r, reply_w]
        )
        for fd in (devnull, request_r, reply_w):
            os.close(fd)
        budget = limits["output_bytes"]
        streams = {reply_r: bytearray(), ready_r: bytearray()}
        if self.collect(
            streams,
            Deadline(FETCH_S),
            counted=(reply_r,),
            limit=2 * budget + 65536,  # base64 and JSON around at most `budget` bytes
            until_closed=(reply_r,),
            feed=(request_w, frame({"paths": paths, "budget": budget})),
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(fetcher, signal.SIGKILL)
        self.wait_exit(fetcher, 1.0)
        for fd in streams:
            os.close(fd)
        replies = complete_frames(streams[reply_r])
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

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "ping":
            return {"pong": True, "runner": source_version()}
        job = request["job"]
        if job.get("judge", {}).get("pytest"):
            self.zygote("pytest")  # started, if this is the first, before the job's time starts
        self.restore_dirs()
        self.job_time = JobTime.of(job["limits"])
        try:
            return self.run_call(job) if job.get("judge") else self.run_io(job)
        finally:
            self.clear_builds()


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
    ready, _, _ = select.select([listener, 0], [], [])
    if listener in ready:
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
            request = read_frame(0)
        except PeerClosed:
            return
        try:
            reply = supervisor.handle(request)
        except Exception as exc:  # an infrastructure failure: the host retries elsewhere
            _log(f"internal error: {exc!r}")
            reply = {"internal_error": repr(exc)}
        reply["id"] = request.get("id")
        listener = _listen_for_host() if first and "pong" in reply else None
        if listener is not None:
            reply["socket"] = HOST_SOCKET
        write_frame(1, reply)
        if listener is not None:
            _await_host(listener)
        first = False
