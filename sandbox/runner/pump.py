"""Where the supervisor waits while a job runs, and what it measures there.

One wait (``Pump.run``) serves every step of every job: for the pipes of the job's processes
(``Pipes``: what each carried, what is left to feed one, the bounds on what they may carry),
for a child's exit (SIGCHLD, through a wakeup pipe; ``Pump.reap`` keeps its wait status and CPU
time), for the step's ``Deadline``, and for the next heartbeat the host must hear. The
container's cgroup counters (memory kills, CPU time) and each process's scheduler statistics
say why a process ended and how long it waited for a CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import selectors
import signal
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .wire import write_frame

if TYPE_CHECKING:
    from .wire import Limits

EXCERPT_BYTES = 4096
# Pipes read only when their writer ends: emptied this often meanwhile, so that a writer the
# pipe cannot hold waits this long at most.
POLL_S = 0.05
# While a job runs, the host hears from the supervisor at least this often, so a paused or
# frozen container is found by its silence long before the job's host deadline.
HEARTBEAT_S = 1.0
EXIT_GRACE_S = 1.0  # how long a program's output still counts after its main process exits
OOM_CONTROL = "/sys/fs/cgroup/memory/memory.oom_control"  # cgroup v1
OOM_EVENTS = "/sys/fs/cgroup/memory.events"  # cgroup v2
CPU_USAGE = "/sys/fs/cgroup/cpuacct/cpuacct.usage"  # cgroup v1, ns
CPU_STAT = "/sys/fs/cgroup/cpu.stat"  # cgroup v2, usage_usec

ExitInfo = tuple[int, float]  # a reaped process's wait status and CPU seconds


class SetupFailed(RuntimeError):
    """The sandbox could not set up a program's process: the container is broken."""


def excerpt(data: bytes | bytearray) -> str:
    return bytes(data[:EXCERPT_BYTES]).decode("utf-8", "replace")


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


def signal_verdict(exit_info: ExitInfo | None, limits: Limits, oom: bool) -> tuple[str, str] | None:
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


def how_it_ended(exit_info: ExitInfo | None, name: str) -> str:
    if exit_info is None:
        return f"the {name} was still running"
    status = exit_info[0]
    if os.WIFSIGNALED(status):
        return f"the {name} was killed by {signal_name(os.WTERMSIG(status))}"
    return f"the {name} exited with status {os.waitstatus_to_exitcode(status)}"


def signal_name(number: int) -> str:
    """``SIGSEGV``, or ``SIGRTMIN+3`` / ``signal 40`` for the ones ``signal.Signals`` lacks."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


@dataclasses.dataclass(frozen=True)
class JobTime:
    """A whole job's real-time limit (``Limits.job_time_s``): when it ends, and how long it is."""

    ends: float = math.inf  # time.monotonic()
    limit_s: float | None = None

    @classmethod
    def of(cls, limits: Limits) -> JobTime:
        limit = limits["job_time_s"]
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
        limits: Limits | None = None,
        pids: tuple[int, ...] | None = (),
        started: float | None = None,
        job: JobTime | None = None,
    ) -> None:
        """``pids`` () counts no waiting; None counts the container's shortfall alone, for work
        that never sleeps (a compiler, whose processes come and go)."""
        self.started = time.monotonic() if started is None else started
        self.limit_s, self.pids = limit_s, pids
        self.cap_s = limit_s if limits is None else max(limit_s, limits["wall_cap_s"])
        self.cpus = 1.0 if limits is None else limits["cpus"]
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


class Pipes:
    """The pipes of one wait: those it reads, each into its buffer until it closes; the one it
    feeds; and the bounds on what the read ones may carry (past one, the wait ends)."""

    def __init__(self) -> None:
        self.buffers: dict[int, bytearray] = {}
        self.open: set[int] = set()
        self.polled: set[int] = set()  # read every POLL_S, not as each write arrives
        self.feeding: int | None = None  # the pipe it writes to, until all of ``pending`` went
        self.pending = memoryview(b"")
        self.bounds: list[tuple[str, int, tuple[int, ...]]] = []

    def read(self, fd: int, *, polled: bool = False) -> bytearray:
        """Read ``fd`` from now on; returns what it carries, as it comes."""
        self.buffers[fd] = buffer = bytearray()
        self.open.add(fd)
        if polled:
            self.polled.add(fd)
        return buffer

    def feed(self, fd: int, data: bytes) -> None:
        """Write ``data`` to ``fd`` during the next wait, then close it."""
        os.set_blocking(fd, False)
        self.feeding, self.pending = fd, memoryview(data)

    def bound(self, outcome: str, most: int, *fds: int) -> None:
        """The wait ends with ``outcome`` once ``fds`` carried more than ``most`` bytes."""
        self.bounds.append((outcome, most, fds))

    def alone(self, fd: int) -> Pipes:
        """A wait for ``fd`` alone, read on into the same buffer, with no bound."""
        pipes = Pipes()
        pipes.buffers[fd] = self.buffers[fd]
        pipes.open = self.open & {fd}
        return pipes

    def closed(self, fd: int) -> bool:
        return fd not in self.open

    def all_closed(self) -> bool:
        return not self.open

    def over(self) -> str | None:
        """The outcome of the first bound the pipes passed."""
        for outcome, most, fds in self.bounds:
            if sum(len(self.buffers[fd]) for fd in fds) > most:
                return outcome
        return None

    def drain(self, fds: Iterable[int]) -> None:
        """What the pipes ``fds`` hold now (a pipe holds at most 1 MiB), without waiting."""
        for fd in fds:
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                self.buffers[fd] += os.read(fd, 1 << 20)

    def take(self, fd: int) -> bool:
        """Read what ``fd`` has; False at its end."""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self.open.discard(fd)
            return False
        self.buffers[fd] += chunk
        return True

    def give(self, fd: int) -> bool:
        """Write the next part of what is fed to ``fd``; False once all of it went or its
        reader left."""
        try:
            self.pending = self.pending[os.write(fd, self.pending[: 1 << 16]) :]
        except BrokenPipeError:
            self.pending = self.pending[:0]
        except BlockingIOError:
            return True
        return bool(self.pending)

    def stop_feeding(self) -> None:
        """Close the pipe it feeds: its reader sees the end of its input."""
        if self.feeding is not None:
            os.close(self.feeding)
            self.feeding = None

    def close(self) -> None:
        for fd in self.buffers:
            os.close(fd)


class Pump:
    """The supervisor's children's exits, its heartbeat, and the one wait of every job."""

    def __init__(self) -> None:
        self.exited: dict[int, ExitInfo] = {}
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.last_beat = 0.0

    def beat(self) -> None:
        """A heartbeat frame to the host, at most every ``HEARTBEAT_S``."""
        now = time.monotonic()
        if now - self.last_beat >= HEARTBEAT_S:
            write_frame(1, {"heartbeat": True})
            self.last_beat = now

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

    def run(self, pipes: Pipes, deadline: Deadline, until: Callable[[], bool]) -> str | None:
        """Pump ``pipes`` until ``until()``; the limit that ended the wait first ("timeout", or
        the outcome of the bound the pipes passed), else None. What was left to feed is not
        fed after it. The polled pipes are emptied every ``POLL_S`` only: a reply per call
        would wake this process, and stop the program, each time."""
        selector = selectors.DefaultSelector()
        selector.register(self.wake_r, selectors.EVENT_READ)
        for fd in pipes.open - pipes.polled:
            selector.register(fd, selectors.EVENT_READ)
        if pipes.feeding is not None:
            selector.register(pipes.feeding, selectors.EVENT_WRITE)
        next_poll = time.monotonic() + POLL_S
        try:
            while not until():
                remaining = deadline.remaining()
                if remaining <= 0:
                    return "timeout"
                self.beat()
                wait = min(remaining, HEARTBEAT_S)
                if pipes.polled:
                    if time.monotonic() >= next_poll:
                        pipes.drain(pipes.polled)
                        next_poll = time.monotonic() + POLL_S
                    wait = min(wait, max(next_poll - time.monotonic(), 0.0))
                for key, _ in selector.select(wait):
                    if key.fd == self.wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(key.fd, 4096)
                        self.reap()
                    elif key.fd == pipes.feeding:
                        if not pipes.give(key.fd):
                            selector.unregister(key.fd)
                            pipes.stop_feeding()
                    elif not pipes.take(key.fd):
                        selector.unregister(key.fd)
                over = pipes.over()
                if over is not None:
                    return over
            return None
        finally:
            selector.close()
            pipes.stop_feeding()

    def after_exit(self, pipes: Pipes, deadline: Deadline) -> tuple[str | None, bool]:
        """After a program's main process exits: its output until every pipe closes, for at most
        ``EXIT_GRACE_S``, so a child that writes just after its parent exits still counts.
        Returns the limit hit (or None) and whether processes still held the pipes at the end.
        """
        end = Deadline(min(EXIT_GRACE_S, max(deadline.remaining(), 0.0)))
        outcome = self.run(pipes, end, until=pipes.all_closed)
        if outcome == "timeout":  # the program itself ended in time: only its children did not
            return None, True
        return outcome, False
