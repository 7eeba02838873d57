"""State left behind in a container: leavers (every kind a program can leave), the checker that
looks for it on every container after them, and attackers that mark a container's state kind
by kind for the next program to find."""

from __future__ import annotations

import textwrap

from redteam_samples import (
    program,
)

# -- state left behind: a "leaver" (an ADD program) runs on every container, then the CHECKER
# (a LEFTOVERS program) on every container

_SLOW_TRUE = """

_calls = []


def add(a, b):
    if not _calls:
        time.sleep(0.6)  # keep this container busy so the other one takes the twin job
    _calls.append(1)
    return a + b
"""

# In the order the suite runs them: a leftover that the sweep cannot remove stays for good.
LEAVERS = {
    "processes": program("""
        import os
        import signal
        import socket
        import subprocess
        import time

        if os.fork() == 0:  # a double-forked daemon in its own session, deaf to signals
            os.setsid()
            if os.fork() == 0:
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1):
                    signal.signal(sig, signal.SIG_IGN)
                listener = socket.socket()
                listener.bind(("127.0.0.1", 45678))
                listener.listen()
                abstract = socket.socket(socket.AF_UNIX)
                abstract.bind("\\0codepost-leftover")
                while True:
                    try:
                        with open("/tmp/daemon-alive", "w") as f:
                            f.write(str(time.time()))
                    except OSError:
                        pass
                    time.sleep(0.01)
            os._exit(0)
        if os.fork() == 0:  # a process that keeps changing its pid
            while True:
                try:
                    if os.fork():
                        os._exit(0)
                except OSError:
                    pass
        if os.fork() == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        """)
    + _SLOW_TRUE,
    "ipc_and_env": program("""
        import ctypes
        import os
        import time

        libc = ctypes.CDLL(None, use_errno=True)
        IPC_CREAT = 0o1000
        segment = libc.shmget(0x5EC7, 4096, IPC_CREAT | 0o600)
        libc.shmget(0x5EC8, 4096, IPC_CREAT | 0o600)  # created, never attached
        libc.shmat.restype = ctypes.c_void_p
        if segment >= 0:
            libc.shmat(segment, None, 0)
        libc.msgget(0x5EC9, IPC_CREAT | 0o600)
        libc.semget(0x5ECA, 1, IPC_CREAT | 0o600)
        try:
            librt = ctypes.CDLL("librt.so.1", use_errno=True)
            librt.mq_open(b"/leftover", os.O_CREAT | os.O_RDWR, 0o600, None)
        except OSError:
            pass
        libc.syscall(ctypes.c_long(248), b"user", b"leftover", b"x", ctypes.c_size_t(1),
                     ctypes.c_long(-4))  # add_key to the user keyring
        os.environ["LEFTOVER"] = "1"
        os.putenv("LEFTOVER_PUTENV", "1")
        """)
    + _SLOW_TRUE,
    # Each leaver tolerates what a previous one left (a container the sweep could not clean).
    "files": program("""
        import os
        import socket
        import time


        def _leave(d):
            for name in ("plain", ".hidden"):
                with open(f"{d}/{name}", "w") as f:
                    f.write("left")
            os.mkfifo(f"{d}/fifo")
            os.symlink("/etc/passwd", f"{d}/link")
            socket.socket(socket.AF_UNIX).bind(f"{d}/sock")
            with open(f"{d}/unreadable", "w") as f:
                f.write("left")
            os.chmod(f"{d}/unreadable", 0)
            for name, mode in (("readonly", 0o500), ("locked", 0)):
                os.makedirs(f"{d}/{name}/inner")
                with open(f"{d}/{name}/inner/file", "w") as f:
                    f.write("left")
                os.chmod(f"{d}/{name}/inner", mode)
                os.chmod(f"{d}/{name}", mode)


        for d in ("/work", "/tmp", "/dev/shm"):
            try:
                _leave(d)
            except OSError:
                pass
        """)
    + _SLOW_TRUE,
    "deep_directories": program("""
        import os
        import time

        for d in ("/tmp", "/work"):
            os.chdir(d)
            for _ in range(2500):
                try:
                    os.mkdir("d")
                except FileExistsError:
                    pass
                os.chdir("d")
            with open("bottom", "w") as f:
                f.write("left")
        os.chdir("/work")
        with open("/dev/shm/after-the-deep-one", "w") as f:
            f.write("left")
        """)
    + _SLOW_TRUE,
    "many_directories": program("""
        import os
        import time

        for top in ("/tmp", "/work", "/dev/shm"):
            try:
                for made in range(300_000):
                    os.mkdir(f"{top}/d{made}")
            except OSError:
                pass
        """)
    + _SLOW_TRUE,
    "work_dir_mode": program("""
        import os
        import time

        try:
            os.chmod("/work", 0)  # root's: a program cannot lock later ones out
        except OSError:
            pass
        """)
    + _SLOW_TRUE,
}

# Reports whatever a previous job left; the test expects an empty list.
CHECKER = program("""
    import os
    import time

    CLEAN_ENV = {"PATH", "HOME", "LANG", "MALLOC_ARENA_MAX", "PYTHONINTMAXSTRDIGITS"}  # the sandbox sets exactly these


    def leftovers():
        time.sleep(0.3)  # keep this container busy so the other one takes the twin job
        me, uid, found = os.getpid(), os.getuid(), []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                try:
                    with open(f"/proc/{entry}/status") as f:
                        if f"Uid:\\t{uid}\\t" in f.read():
                            found.append(f"process {entry}")
                except OSError:
                    pass
        for d in ("/work", "/tmp", "/dev/shm", "/dev/mqueue"):
            try:
                found += [f"{d}/{name}" for name in os.listdir(d)]
            except OSError as exc:
                if d != "/dev/mqueue":
                    found.append(f"{d}: {exc}")
        for kind in ("shm", "msg", "sem"):
            with open(f"/proc/sysvipc/{kind}") as f:
                found += [f"sysv {kind} {line.split()[0]}" for line in f.read().splitlines()[1:]]
        with open("/proc/net/tcp") as f:
            found += ["tcp listener" for line in f.read().splitlines()[1:]
                      if line.split()[3] == "0A"]
        with open("/proc/net/unix") as f:
            found += [f"unix socket {line.split()[-1]}" for line in f.read().splitlines()[1:]
                      if len(line.split()) > 7]
        found += [f"env {key}" for key in sorted(set(os.environ) - CLEAN_ENV)]
        try:
            with open("/proc/keys") as f:
                found += [f"key {line}" for line in f.read().splitlines() if "leftover" in line]
        except OSError:
            pass
        return found
    """)


# -- state of one container, kind by kind (issue 17, class 2): an attacker marks it, then an
# honest victim must find the container as the victim before the attacker found it

_ACL_NONE = (  # a default ACL that gives nobody anything: files made later are unreadable
    "struct.pack('<I', 2) + b''.join(struct.pack('<HHI', tag, 0, 0xFFFFFFFF) "
    "for tag in (1, 4, 0x20))"
)
STATE_ATTACKS = {
    "extended_attributes": "for d in DIRS:\n    os.setxattr(d, 'user.mark', b'1')",
    "default_acl": f"os.setxattr('/work', 'system.posix_acl_default', {_ACL_NONE})",
    "mode": "os.chmod('/work', 0o555)",  # still listable: no sweep would notice
    "times": "for d in DIRS:\n    os.utime(d, (1, 1))",
    "times_by_touch": "for d in DIRS:\n    os.utime(d)",  # even without owning them
}


def state_attacker(marks: str) -> str:
    """An io program that tries each mark (a refused one is skipped) and leaves no file."""
    body = textwrap.indent(marks, "    ")
    return f"import os, struct\nDIRS = ('/work', '/tmp', '/dev/shm')\ntry:\n{body}\nexcept OSError:\n    pass\n"


# Prints what a program can see of the writable directories, then uses them.
STATE_VICTIM = program("""
    import os

    for d in ("/work", "/tmp", "/dev/shm"):
        st = os.stat(d)
        print(d, oct(st.st_mode), st.st_uid, st.st_atime_ns, st.st_mtime_ns, os.listxattr(d))
    for d in ("/work", "/tmp", "/dev/shm"):
        with open(f"{d}/mine", "w") as f:
            f.write("x")
        with open(f"{d}/mine") as f:
            print(d, f.read())
    """)

# The judge's memory: classes the judge makes for a program's exceptions, each named with
# megabytes (the frame limit of the code before issue 17 allowed 8 MB), then an honest program
# whose result needs memory in the judge.
JUDGE_CACHE_ATTACKER = program("""
    import gc


    def f(i):
        gc.collect()  # the classes of earlier calls: this program keeps none of them
        raise type("E" * (7 << 20) + str(i), (ValueError,), {})()
    """)
JUDGE_CACHE_TESTS = (
    "for i in range(200):\n    try:\n        f(i)\n    except ValueError:\n        pass",
)
LARGE_RESULT = "def f(n):\n    return list(range(n))\n"
LARGE_RESULT_TESTS = ("assert f(800_000) == list(range(800_000))",)
