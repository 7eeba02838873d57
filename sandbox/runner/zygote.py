"""Zygotes: small, clean processes that fork every process a job runs in.

Each is started with a fresh interpreter, never handed a job, so its memory never held a
test, an expected output or a caller's code, and what it forks inherits nothing from another
job. The candidates' zygote forks every process of the sandbox user (programs, compilers, file
readers); the judges' forks one judge process per call job, under the judge user, which dies
with the job: test code a caller sent cannot outlive it. Judges that run pytest fork from a
zygote of their own, started on the first job that needs one: pytest's modules would double
the heap, and so the cost, of every other judge's fork. A fresh, small heap also means fewer
copy-on-write faults per fork, which is most of the cost of an execution.

A process is forked with ``clone(CLONE_PARENT)``: it is born the supervisor's child, which
reaps it (its wait status and CPU time), without the intermediate process of a double fork
(a second fork and exit of the whole zygote for every process). The zygote is single-threaded,
and glibc (2.34 and later: Debian bookworm's 2.36) signals the calling thread by its kernel id
in ``raise``, so the child's copy of the zygote's cached thread id misleads nothing it uses.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import site
import socket
import sys
from typing import Any

from . import candidate
from .isolation import drop_to, empty_dir, set_limits

WRITABLE_DIRS = ("/work", "/tmp", "/dev/shm")
JUDGE_KINDS = ("judge", "pytest")  # the zygotes that fork judges; "pytest" has pytest imported
JUDGE_MODES = ("judge", "values")  # what the judge user's processes are for
# clone(2)'s system call where the flags come first (the other arguments are 0 here)
_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
_CLONE_PARENT = 0x00008000
_LIBC = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the call holds the GIL, as os.fork does


def _python_step(name: str) -> Any:
    """One of Python's own steps around a fork (no arguments, no result), looked up once, here:
    only children call ``PyOS_AfterFork_Child``, and its lookup in each child (ctypes makes a
    function object on first use) cost every process 55 copy-on-write faults and 0.15 ms."""
    step = getattr(ctypes.pythonapi, name)
    step.restype, step.argtypes = None, ()
    return step


_BEFORE_FORK = _python_step("PyOS_BeforeFork")
_AFTER_FORK_CHILD = _python_step("PyOS_AfterFork_Child")
_AFTER_FORK_PARENT = _python_step("PyOS_AfterFork_Parent")


def _take_fds(fds: list[int]) -> None:
    """Make ``fds`` this process's 0, 1, 2...; close every other descriptor."""
    above = max(*fds, len(fds)) + 1  # copies out of the way of 0..n and of each other
    high = [os.dup2(fd, above + i) for i, fd in enumerate(fds)]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), 1024)


def _ready(fd: int) -> None:
    """One byte on ``fd``: the set-up worked. Closed before any job code runs, so that code
    cannot fake a set-up failure (which the supervisor treats as the container's fault)."""
    os.write(fd, b"1")
    os.close(fd)


def _become_candidate(fds: list[int], mode: str, limits: dict[str, Any], uid: int) -> None:
    """In the grandchild: isolate, drop privileges and run the program. Never returns.

    ``fds`` become 0-2 (stdio), 3 and 4 (requests in, replies out) and 5 (set-up report).
    """
    try:
        os.setsid()
        _take_fds(fds)
        # The OOM killer takes the program, never the supervisor. (A file object here would
        # cost a tenth of a trivial job's CPU, in the copy-on-write faults of its set-up.)
        oom = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(oom, b"1000")
        os.close(oom)
        os.nice(19)  # however many processes it runs, the supervisor gets its CPU when it needs it
        set_limits(limits)
        drop_to(uid)
        os.chdir("/work")
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        os._exit(111)
    _ready(5)
    try:
        _MODES[mode](3, 4)
    except BaseException as exc:  # never back into the zygote's loop, whatever happened
        os.write(2, f"[sandbox] the runner failed: {exc!r}\n".encode())
        os._exit(1)
    os._exit(0)


# What a process of the sandbox user is for: each reads its job on fd 3, replies on fd 4.
_MODES = {
    "call": candidate.serve,  # a program the judge calls into
    "io": candidate.run_main,  # a program run on one stdin case
    "compile": candidate.compile_program,  # a compiled language's compiler, once per job
    "fetch": candidate.fetch_files,  # reads back the files an io case left
}


def _become_judge(fds: list[int], mode: str, limits: dict[str, Any], uid: int) -> None:
    """In the grandchild: the judge of one job, or the decider of a job's value tests (see
    ``judge.decide_values``), under the judge user and its limits (CPU, memory, threads and
    processes). Never returns.

    ``fds`` become 0-2 (/dev/null), then the mode's own: a judge's 3 (the job), 4 and 5 (to and
    from the candidate), 6 (test outcomes to the supervisor); a decider's 3 (the job, then the
    candidate's replies) and 4 (test outcomes); and last, the set-up report.
    """
    from . import judge

    try:
        os.setsid()
        _take_fds(fds)
        set_limits(limits)
        drop_to(uid)  # and so not dumpable: the program's user cannot read its memory
        os.chdir("/")
    except BaseException:
        os._exit(111)
    _ready(len(fds) - 1)
    try:
        if mode == "judge":
            judge.run_job(3, 4, 5, 6)
        else:
            judge.decide_values(3, 4)
    except BaseException:
        os._exit(1)
    os._exit(0)


def _fork_sibling() -> int:
    """``os.fork()``, but the child's parent is the supervisor (``CLONE_PARENT``), which is
    signalled when it exits; Python's own before- and after-fork steps run as in ``os.fork``."""
    _BEFORE_FORK()
    pid = _LIBC.syscall(_CLONE, _CLONE_PARENT | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        _AFTER_FORK_CHILD()
        return 0
    _AFTER_FORK_PARENT()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT) failed")
    return pid


def _spawn(request: dict[str, Any], fds: list[int], uid: int) -> dict[str, Any]:
    """Fork the process as the supervisor's child, so that it can reap it."""
    pid = _fork_sibling()
    if pid == 0:
        if request["mode"] in JUDGE_MODES:
            _become_judge(fds, request["mode"], request["limits"], uid)
        _become_candidate(fds, request["mode"], request["limits"], uid)
    return {"pid": pid}


def _sweep(uid: int) -> dict[str, Any]:
    """Kill every process of ``uid`` and empty the writable directories of its files."""
    sweeper = os.fork()
    if sweeper == 0:
        try:
            drop_to(uid)
            os.kill(-1, signal.SIGKILL)  # atomic against forks; spares only the caller
            for path in WRITABLE_DIRS:
                empty_dir(path)
        finally:
            os._exit(0)
    _, status = os.waitpid(sweeper, 0)
    return {"swept": os.waitstatus_to_exitcode(status) == 0}


def _as_a_program() -> None:
    """What every process of the sandbox user starts with, set once in its zygote: the
    environment a program and what it starts see, Python's behaviour as a program's own
    interpreter has it, and the program's standard streams."""
    os.environ.clear()
    os.environ.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/work",
            "LANG": "C.UTF-8",
            "MALLOC_ARENA_MAX": "2",
            "PYTHONINTMAXSTRDIGITS": "0",
        }  # for programs it starts; see supervisor.PROGRAM_ENV
    )
    # Python before 3.11, which the data sets were written for, printed ints of any size.
    sys.set_int_max_str_digits(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The program's own streams on its 0, 1 and 2, which are pipes in each process (made there,
    # they cost a fifth of its page faults): made here on a pipe too, so that they say what it
    # is (not seekable, its block size). ``sys.__stdout__`` is the same object, as in any
    # interpreter, so what is written to it is flushed too.
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    read_end, write_end = os.pipe()
    for fd, end in ((0, read_end), (1, write_end), (2, write_end)):
        os.dup2(end, fd)
    sys.stdin, sys.stdout, sys.stderr = (
        open(fd, mode, encoding="utf-8", errors=errors, closefd=False)  # noqa: SIM115
        for fd, mode, errors in (
            (0, "r", "replace"),
            (1, "w", "backslashreplace"),
            (2, "w", "backslashreplace"),
        )
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc, assignment]
    for fd, copy in zip((0, 1, 2), saved, strict=True):
        os.dup2(copy, fd)
        os.close(copy)
    os.close(read_end)
    os.close(write_end)


def main(control_fd: int, uid: int, kind: str = "candidate") -> None:
    """Serve the supervisor's spawn and sweep requests; ``kind`` is ``candidate``, ``judge``
    (whose zygote has the judge's modules imported, for every judge to share) or ``pytest``
    (the judge's and pytest's)."""
    if kind in JUDGE_KINDS:
        from . import judge  # noqa: F401
    if kind == "pytest":
        from . import pytest_judge

        pytest_judge.import_pytest()
    if kind == "candidate":
        _as_a_program()
    control = socket.socket(fileno=control_fd)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):  # never let a child inherit the host protocol stream
        os.dup2(devnull, fd)
    # The builtins `site` adds to every `python3 program.py` (exit, quit, help...): the
    # interpreter runs with -S, which keeps site-packages out.
    site.setquit()
    site.sethelper()
    site.setcopyright()
    gc.freeze()  # keep the collector from touching (and so copying) inherited pages
    control.send(b"ready")  # the container takes no job before both zygotes are up
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)
        if not message:
            return
        request = json.loads(message)
        reply = _spawn(request, fds, uid) if request["op"] == "spawn" else _sweep(uid)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps(reply).encode())
