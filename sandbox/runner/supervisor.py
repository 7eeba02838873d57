"""PID 1 of a sandbox container: takes jobs from the host, runs them, cleans up after each.

Process layout inside the container (all started once per container except the last two):

    supervisor (PID 1, root, caps SETUID/SETGID/KILL only)  -- holds the job: program + tests
    +-- zygote (root)        forked before any job was read: its memory never held a test;
    |                        forks every sandbox-user process, so none can read a test
    +-- candidate (sandbox user, one per job or io case)  -- reparented here by a double fork
    +-- judge (judge user, one per call-mode job)         -- forked from the supervisor

After every job the zygote forks a sweeper as the sandbox user that kills every process of
that user in one ``kill(-1)`` (atomic against forks) and empties the writable directories,
so nothing a program leaves behind reaches the next one.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
from typing import Any

from . import candidate as candidate_side
from . import judge as judge_side
from .codec import PeerClosed, read_frame, write_frame

CANDIDATE_UID = int(os.environ.get("CODEPOST_CANDIDATE_UID", "10001"))
JUDGE_UID = int(os.environ.get("CODEPOST_JUDGE_UID", "10002"))
WRITABLE_DIRS = ("/work", "/tmp", "/dev/shm")
EXCERPT_BYTES = 4096
_PR_SET_DUMPABLE = 4


def _log(message: str) -> None:
    os.write(2, f"[supervisor] {message}\n".encode())


def _set_not_dumpable() -> None:
    """A non-dumpable process cannot be ptraced or have /proc/PID/mem read by other users."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _set_limits(limits: dict[str, Any], processes: int) -> None:
    mb = 1 << 20
    cpu = max(1, int(limits["cpu_time_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["disk_mb"] * mb, limits["disk_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _empty_dir(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            full = os.path.join(root, name)
            try:
                if os.path.islink(full):
                    os.unlink(full)
                else:
                    os.rmdir(full)
            except OSError:
                pass


# --------------------------------------------------------------------------- zygote

def _become_candidate(fds: list[int], mode: str, limits: dict[str, Any]) -> None:
    """In the grandchild: isolate, drop privileges and run the program. Never returns."""
    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]  # out of the way of 0..4
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(len(fds), 65536)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        _set_limits(limits, limits["processes"])
        _drop_to(CANDIDATE_UID)
        os.chdir("/work")
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work",
                           "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"})
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        os._exit(111)
    if mode == "call":
        candidate_side.serve(3, 4)
    else:
        candidate_side.run_main(3, 4)
    os._exit(0)


def _zygote_loop(control: socket.socket) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):  # never let a child inherit the host protocol stream
        os.dup2(devnull, fd)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        request = json.loads(message)
        if request["op"] == "spawn":
            reply = _zygote_spawn(request, fds)
        else:
            reply = _zygote_sweep()
        for fd in fds:
            os.close(fd)
        control.send(json.dumps(reply).encode())


def _zygote_spawn(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    pid_r, pid_w = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(pid_r)
        grandchild = os.fork()
        if grandchild == 0:
            os.close(pid_w)
            _become_candidate(fds, request["mode"], request["limits"])
        os.write(pid_w, str(grandchild).encode())
        os._exit(0)
    os.close(pid_w)
    pid = int(os.read(pid_r, 32) or b"0")
    os.close(pid_r)
    os.waitpid(intermediate, 0)  # after this the candidate is the supervisor's child
    return {"pid": pid}


def _zygote_sweep() -> dict[str, Any]:
    sweeper = os.fork()
    if sweeper == 0:
        try:
            _drop_to(CANDIDATE_UID)
            os.kill(-1, signal.SIGKILL)  # every process of the sandbox user but this one
            for path in WRITABLE_DIRS:
                _empty_dir(path)
        finally:
            os._exit(0)
    _, status = os.waitpid(sweeper, 0)
    return {"swept": os.waitstatus_to_exitcode(status) == 0}


# --------------------------------------------------------------------------- supervisor

class Zygote:
    def __init__(self) -> None:
        self.control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            self.control.close()
            _zygote_loop(child_end)
        child_end.close()

    def call(self, request: dict[str, Any], fds: list[int] = ()) -> dict[str, Any]:
        socket.send_fds(self.control, [json.dumps(request).encode()], list(fds))
        reply = self.control.recv(1 << 16)
        if not reply:
            raise RuntimeError("the zygote died")
        return json.loads(reply)


class Supervisor:
    def __init__(self) -> None:
        self.zygote = Zygote()
        self.exited: dict[int, tuple[int, float]] = {}  # pid -> (wait status, cpu seconds)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    # -- process bookkeeping

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.zygote.pid:
                _log("zygote exited; starting a new one")
                self.zygote = Zygote()
            self.exited[pid] = (status, usage.ru_utime + usage.ru_stime)

    def sweep(self, *pids: int) -> None:
        for pid in pids:
            if pid not in self.exited:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.zygote.call({"op": "sweep"})
        deadline = time.monotonic() + 2.0
        while any(pid not in self.exited for pid in pids) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.0005)
        self.reap()
        self.exited.clear()

    def leftover_processes(self) -> int:
        """Processes of the sandbox users still alive after a sweep (should be none)."""
        for _ in range(20):
            self.reap()
            count = sum(1 for pid in os.listdir("/proc") if pid.isdigit() and _owned_by_sandbox(pid))
            if count == 0:
                return 0
            time.sleep(0.005)
        return count

    def spawn_candidate(self, mode: str, limits: dict[str, Any], stdin_fd: int,
                        out_w: int, err_w: int, rpc_in: int, rpc_out: int) -> int:
        reply = self.zygote.call({"op": "spawn", "mode": mode, "limits": limits},
                                 [stdin_fd, out_w, err_w, rpc_in, rpc_out])
        return reply["pid"]

    def fork_judge(self, job: dict[str, Any], to_cand: int, from_cand: int, results: int,
                   stderr: int) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.set_wakeup_fd(-1)
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (to_cand, from_cand, results)]
                devnull = os.open("/dev/null", os.O_RDWR)
                for target, fd in enumerate((devnull, devnull, stderr, *high)):
                    os.dup2(fd, target)
                os.closerange(6, 65536)
                to_cand, from_cand, results = 3, 4, 5
                _set_not_dumpable()
                limits = dict(job["limits"], memory_mb=max(2048, job["limits"]["memory_mb"]),
                              cpu_time_s=job["limits"]["wall_time_s"] + 1, disk_mb=1)
                _set_limits(limits, 4)
                _drop_to(JUDGE_UID)
                judge_side.run(job, to_cand, from_cand, results)
            except BaseException as exc:
                os.write(2, f"judge failed: {exc!r}\n".encode())
                code = 1
            os._exit(code)
        return pid

    # -- collecting output

    def collect(self, streams: dict[int, bytearray], limit: int, deadline: float,
                until_closed: int | None, until_exit: int | None,
                feed: tuple[int, bytes] | None = None) -> str | None:
        """Read the given pipes until ``until_closed`` hits EOF or ``until_exit`` exits.

        Returns "timeout" or "output_limit" when a limit ended it, else None.
        """
        selector = selectors.DefaultSelector()
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(self.wake_r, selectors.EVENT_READ)
        pending = memoryview(feed[1]) if feed else None
        if feed:
            os.set_blocking(feed[0], False)
            selector.register(feed[0], selectors.EVENT_WRITE)
        open_fds = set(streams)
        output_fds = [fd for fd in streams if fd != until_closed]
        outcome = None
        try:
            while True:
                if until_closed is not None and until_closed not in open_fds:
                    break
                if until_exit is not None and until_exit in self.exited:
                    self._drain(streams, open_fds)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome = "timeout"
                    break
                for key, _ in selector.select(remaining):
                    fd = key.fd
                    if fd == self.wake_r:
                        try:
                            os.read(fd, 4096)
                        except BlockingIOError:
                            pass
                        self.reap()
                    elif feed and fd == feed[0]:
                        try:
                            pending = pending[os.write(fd, pending[: 1 << 16]) :]
                        except BrokenPipeError:
                            pending = pending[:0]
                        except BlockingIOError:
                            continue
                        if not pending:
                            selector.unregister(fd)
                            os.close(fd)
                            feed = None
                    else:
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            selector.unregister(fd)
                            open_fds.discard(fd)
                        else:
                            streams[fd] += chunk
                if sum(len(streams[fd]) for fd in output_fds) > limit:
                    outcome = "output_limit"
                    break
        finally:
            selector.close()
            if feed:
                os.close(feed[0])
        return outcome

    @staticmethod
    def _drain(streams: dict[int, bytearray], open_fds: set[int]) -> None:
        """Take what is already in the pipes of a process that has exited."""
        end = time.monotonic() + 0.05
        for fd in list(open_fds):
            os.set_blocking(fd, False)
            while time.monotonic() < end:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                streams[fd] += chunk

    # -- the two job kinds

    def run_call(self, job: dict[str, Any]) -> dict[str, Any]:
        limits = job["limits"]
        started = time.monotonic()
        deadline = started + limits["wall_time_s"]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        j2c_r, j2c_w = os.pipe()
        c2j_r, c2j_w = os.pipe()
        res_r, res_w = os.pipe()
        jerr_r, jerr_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDONLY)
        cand = self.spawn_candidate("call", limits, devnull, out_w, err_w, j2c_r, c2j_w)
        judge = self.fork_judge(job, j2c_w, c2j_r, res_w, jerr_w)
        for fd in (devnull, out_w, err_w, j2c_r, c2j_w, j2c_w, c2j_r, res_w, jerr_w):
            os.close(fd)
        streams = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray(), jerr_r: bytearray()}
        outcome = self.collect(streams, limits["output_bytes"], deadline,
                               until_closed=res_r, until_exit=None)
        cand_exit = self.exited.get(cand)
        self.sweep(cand, judge)
        for fd in streams:
            os.close(fd)
        events = _parse_frames(bytes(streams[res_r]))
        tests = [e for e in events if e.get("event") == "test"]
        load_error = next((e for e in events if e.get("event") == "load_error"), None)
        done = any(e.get("event") == "done" for e in events)
        result: dict[str, Any] = {
            "tests": [{k: e[k] for k in ("name", "passed", "error", "candidate_error",
                                         "duration_s")} for e in tests],
            "stdout": _excerpt(streams[out_r]),
            "stderr": _excerpt(streams[err_r]),
            "duration_s": time.monotonic() - started,
        }
        if outcome == "output_limit":
            result.update(status="output_limit", error="output exceeded "
                          f"{limits['output_bytes']} bytes")
        elif outcome == "timeout":
            result.update(status="timeout", error=f"wall time over {limits['wall_time_s']} s")
        elif load_error is not None:
            result.update(status=load_error["kind"], error=load_error["message"][-2000:])
            result["stderr"] = (result["stderr"] + load_error["message"])[-EXCERPT_BYTES:]
        elif not done:
            result.update(status="sandbox_error",
                          error="judge died: " + _excerpt(streams[jerr_r]))
        else:
            signal_status = _signal_verdict(cand_exit, limits)
            if any(e.get("memory_error") for e in tests):
                result.update(status="memory_limit", error="MemoryError in the program")
            elif signal_status:
                result.update(status=signal_status[0], error=signal_status[1])
            else:
                result["status"] = "completed"
        return result

    def run_io(self, job: dict[str, Any]) -> dict[str, Any]:
        limits = job["limits"]
        started = time.monotonic()
        cases: list[dict[str, Any]] = []
        program_frame = _frame_bytes({"program": job["program"]})
        for stdin_text in job["stdin_cases"]:
            case_started = time.monotonic()
            deadline = case_started + limits["wall_time_s"]
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            prog_r, prog_w = os.pipe()
            stat_r, stat_w = os.pipe()
            cand = self.spawn_candidate("io", limits, in_r, out_w, err_w, prog_r, stat_w)
            for fd in (in_r, out_w, err_w, prog_r, stat_w):
                os.close(fd)
            try:
                os.write(prog_w, program_frame)  # the candidate reads it first thing
            except BrokenPipeError:
                pass
            os.close(prog_w)
            streams = {out_r: bytearray(), err_r: bytearray(), stat_r: bytearray()}
            outcome = self.collect(streams, limits["output_bytes"], deadline, until_closed=None,
                                   until_exit=cand, feed=(in_w, stdin_text.encode()))
            cand_exit = self.exited.get(cand)
            self.sweep(cand)
            for fd in streams:
                os.close(fd)
            compiled = _parse_frames(bytes(streams[stat_r]))
            status, exit_code = "completed", None
            if outcome:
                status = outcome
            elif compiled and "error" in compiled[0]:
                status = "syntax_error"
            elif cand_exit is not None:
                exit_code = os.waitstatus_to_exitcode(cand_exit[0])
                verdict = _signal_verdict(cand_exit, limits)
                if verdict:
                    status = verdict[0]
                elif exit_code != 0:
                    status = "memory_limit" if b"MemoryError" in streams[err_r][-300:] \
                        else "runtime_error"
            cases.append({
                "status": status,
                "stdout": streams[out_r][: limits["output_bytes"]].decode("utf-8", "replace"),
                "stderr": _excerpt(streams[err_r]),
                "exit_code": exit_code,
                "duration_s": time.monotonic() - case_started,
            })
            if status == "syntax_error":
                break
        worst = next((c["status"] for c in cases if c["status"] != "completed"), "completed")
        return {"status": "syntax_error" if worst == "syntax_error" else "completed",
                "cases": cases, "duration_s": time.monotonic() - started}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "ping":
            return {"pong": True, "candidate_uid": CANDIDATE_UID}
        job = request["job"]
        result = self.run_call(job) if job.get("judge") else self.run_io(job)
        result["leftover_processes"] = self.leftover_processes()
        return result


def _signal_verdict(exit_info: tuple[int, float] | None, limits: dict[str, Any]):
    """Map a death by signal to a status: CPU limit -> timeout, OOM kill -> memory_limit."""
    if exit_info is None:
        return None
    status, cpu_seconds = exit_info
    if not os.WIFSIGNALED(status):
        return None
    sig = os.WTERMSIG(status)
    if sig == signal.SIGXCPU or cpu_seconds >= limits["cpu_time_s"] - 0.05:
        return "timeout", f"CPU time over {limits['cpu_time_s']} s"
    if sig == signal.SIGKILL:
        return "memory_limit", "killed by the memory limit"
    if sig == signal.SIGXFSZ:
        return "runtime_error", f"file size over {limits['disk_mb']} MB"
    return "runtime_error", f"killed by signal {signal.Signals(sig).name}"


def _owned_by_sandbox(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1]) in (CANDIDATE_UID, JUDGE_UID)
    except OSError:
        pass
    return False


def _frame_bytes(message: Any) -> bytes:
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data


def _parse_frames(data: bytes) -> list[dict[str, Any]]:
    frames, offset = [], 0
    while offset + 4 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        if offset + 4 + size > len(data):
            break
        frames.append(json.loads(data[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    return frames


def _excerpt(data: bytes | bytearray) -> str:
    return bytes(data[:EXCERPT_BYTES]).decode("utf-8", "replace")


def main() -> None:
    supervisor = Supervisor()
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
        write_frame(1, reply)
