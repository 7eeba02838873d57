"""The zygote: a small, clean process that forks every process of the sandbox user.

It is started with a fresh interpreter before the supervisor reads any job, so its memory
never held a test or an expected output, and forked candidates inherit nothing secret. A
fresh, small heap also means fewer copy-on-write faults per fork, which is most of the cost of
an execution.
"""

from __future__ import annotations

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


def _become_candidate(fds: list[int], mode: str, limits: dict[str, Any], uid: int) -> None:
    """In the grandchild: isolate, drop privileges and run the program. Never returns.

    ``fds`` become 0-2 (stdio), 3 and 4 (requests in, replies out) and 5, on which one byte
    says the set-up worked; 5 is closed before any program code runs, so a program cannot
    fake a set-up failure (which the supervisor treats as the container's fault).
    """
    import fcntl

    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]  # out of the way of 0..4
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(len(fds), 1024)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer takes the program, never the supervisor
        os.nice(19)  # however many processes it runs, the supervisor gets its CPU when it needs it
        set_limits(limits)
        drop_to(uid)
        os.chdir("/work")
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
        # The program's own streams, on the pipes, for as long as it lives; ``sys.__stdout__``
        # is the same object, as in any interpreter, so what is written to it is flushed too.
        sys.stdin, sys.stdout, sys.stderr = (
            open(fd, mode, encoding="utf-8", errors=errors, closefd=False)  # noqa: SIM115
            for fd, mode, errors in (
                (0, "r", "replace"),
                (1, "w", "backslashreplace"),
                (2, "w", "backslashreplace"),
            )
        )
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        os._exit(111)
    os.write(5, b"1")
    os.close(5)
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


def _spawn(request: dict[str, Any], fds: list[int], uid: int) -> dict[str, Any]:
    """Double fork, so the candidate becomes the supervisor's child and it can reap it."""
    pid_r, pid_w = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(pid_r)
        grandchild = os.fork()
        if grandchild == 0:
            os.close(pid_w)
            _become_candidate(fds, request["mode"], request["limits"], uid)
        os.write(pid_w, str(grandchild).encode())
        os._exit(0)
    os.close(pid_w)
    pid = int(os.read(pid_r, 32) or b"0")
    os.close(pid_r)
    os.waitpid(intermediate, 0)
    return {"pid": pid}


def _sweep(uid: int) -> dict[str, Any]:
    """Kill every process of the sandbox user and empty the writable directories."""
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


def main(control_fd: int, uid: int) -> None:
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
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)
        if not message:
            return
        request = json.loads(message)
        reply = _spawn(request, fds, uid) if request["op"] == "spawn" else _sweep(uid)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps(reply).encode())
