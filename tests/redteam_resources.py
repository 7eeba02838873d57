"""Attacks on resources and availability: processes, memory, output, time, the pool's
containers and the host's deadline. Each must end with its status and leave the pool working."""

from __future__ import annotations

from redteam_samples import (
    ADD,
    EVENS,
    FAILED,
    FRAME_SOURCE,
    LEFTOVERS,
    MEMORY_LIMIT,
    NOT_PASSED,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    SQUARE,
    SQUARES,
    TIMEOUT,
    Attack,
    program,
)

RESOURCE_ATTACKS = [
    Attack(
        "spin_ignoring_signals",
        program("""
        import signal

        for sig in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP,
                    signal.SIGALRM, signal.SIGUSR1, signal.SIGVTALRM, signal.SIGPROF):
            signal.signal(sig, signal.SIG_IGN)


        def add(a, b):
            while True:
                try:
                    pass
                except BaseException:
                    pass
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    # The CPU limit strikes first: the job must say timeout however fast the judge finishes.
    Attack(
        "cpu_limit_before_wall_limit",
        program("""
        def add(a, b):
            while True:
                pass
        """),
        frozenset({TIMEOUT}),
        ADD,
        wall_time_s=3.0,
        cpu_time_s=1.0,
    ),
    Attack(
        "spin_at_load",
        program("""
        while True:
            pass
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    Attack(
        "cpu_burn_in_threads",
        program("""
        import threading


        def _spin():
            while True:
                pass


        def add(a, b):
            for _ in range(8):
                try:
                    threading.Thread(target=_spin).start()
                except RuntimeError:  # each thread costs address space: take what we get
                    break
            _spin()
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    Attack(
        "sleep_forever",
        program("""
        import signal
        import time

        signal.signal(signal.SIGTERM, signal.SIG_IGN)


        def add(a, b):
            time.sleep(10_000)
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    # A child keeps the reply pipe open, so the judge sees no end of file when the program dies.
    Attack(
        "child_holds_reply_pipe",
        program("""
        import os
        import time


        def add(a, b):
            if os.fork() == 0:
                time.sleep(10_000)
            while True:
                pass
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    Attack(
        "evil_str_loops_forever",
        program("""
        class Stuck(Exception):
            def __str__(self):
                while True:
                    pass


        def add(a, b):
            raise Stuck()
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    Attack(
        "infinite_generator_result",
        program("""
        import itertools


        def evens(xs):
            return itertools.count(0, 2)
        """),
        frozenset({TIMEOUT, MEMORY_LIMIT}),
        EVENS,
    ),
    Attack(
        "fork_bomb",
        program("""
        import os


        def add(a, b):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """),
        frozenset({TIMEOUT}),
        ADD,
    ),
    Attack(
        "fork_bomb_of_interpreters_at_load",
        program("""
        import subprocess
        import sys

        BOMB = (
            "import os\\n"
            "while True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass"
        )
        for _ in range(64):
            try:
                subprocess.Popen([sys.executable, "-c", BOMB])
            except OSError:
                pass


        def add(a, b):
            return -999
        """),
        NOT_PASSED | {TIMEOUT},
        ADD,
    ),
    Attack(
        "thread_bomb",
        program("""
        import threading
        import time


        def add(a, b):
            try:
                while True:
                    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
            except RuntimeError:
                pass
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "memory_bomb_bytearray",
        program("""
        def add(a, b):
            return len(bytearray(1 << 30))
        """),
        frozenset({MEMORY_LIMIT}),
        ADD,
    ),
    Attack(
        "memory_bomb_list_growth",
        program("""
        def add(a, b):
            hog = []
            while True:
                hog.append("x" * (1 << 20))
        """),
        frozenset({MEMORY_LIMIT}),
        ADD,
    ),
    Attack(
        "memory_bomb_at_load",
        program("""
        HOG = "x" * (1 << 30)


        def add(a, b):
            return a + b
        """),
        frozenset({MEMORY_LIMIT}),
        ADD,
    ),
    # Many processes, each under its own address-space limit, together over the container's.
    Attack(
        "memory_bomb_across_processes",
        program("""
        import os
        import time


        for _ in range(12):
            try:
                if os.fork() == 0:
                    hog = b"x" * (200 << 20)
                    time.sleep(30)
                    os._exit(0)
            except OSError:
                pass
        time.sleep(1.0)


        def add(a, b):
            return -999
        """),
        NOT_PASSED | {MEMORY_LIMIT},
        ADD,
    ),
    Attack(
        "tmpfs_fill",
        program("""
        CHUNK = b"x" * (1 << 20)


        def add(a, b):
            for folder in ("/work", "/tmp", "/dev/shm"):
                for i in range(100):
                    try:
                        with open(f"{folder}/fill{i}", "wb") as f:
                            for _ in range(8):
                                f.write(CHUNK)
                    except OSError:
                        break
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "file_over_disk_limit",
        program("""
        def add(a, b):
            with open("/work/big", "wb") as f:
                while True:
                    f.write(b"x" * (1 << 20))
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "stdout_flood",
        program("""
        def add(a, b):
            while True:
                print("x" * 10_000)
        """),
        frozenset({OUTPUT_LIMIT}),
        ADD,
    ),
    Attack(
        "stdout_flood_at_load_one_write",
        program("""
        import sys
        sys.stdout.write("x" * (10 << 20))
        sys.stdout.flush()


        def add(a, b):
            return a + b
        """),
        frozenset({OUTPUT_LIMIT}),
        ADD,
    ),
    Attack(
        "stderr_flood_from_child",
        program("""
        import os
        import time


        def add(a, b):
            if os.fork() == 0:
                while True:
                    os.write(2, b"E" * 65536)
            time.sleep(0.5)
            return -999
        """),
        frozenset({OUTPUT_LIMIT}),
        ADD,
    ),
    Attack(
        "kill_every_process",
        program("""
        import os
        import signal


        def add(a, b):
            me = os.getpid()
            for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
                if pid != me:
                    for sig in (signal.SIGSTOP, signal.SIGKILL):
                        try:
                            os.kill(pid, sig)
                        except OSError:
                            pass
            for target in (1, -1):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    # A SIGKILL the program sends itself is a crash, not the memory limit.
    Attack(
        "self_sigkill",
        program("""
        import os


        def add(a, b):
            os.kill(os.getpid(), 9)
        """),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    # -- escapes: each returns the right answer only if the escape worked
    Attack(
        "network_escape",
        program("""
        import socket


        def _escaped():
            for host, port in [("127.0.0.1", p) for p in (22, 80, 443, 2375, 2376, 8080)] + [
                ("1.1.1.1", 53), ("1.1.1.1", 80), ("8.8.8.8", 53), ("172.17.0.1", 2375),
                ("172.17.0.1", 80), ("10.255.255.53", 53), ("169.254.169.254", 80),
            ]:
                try:
                    socket.create_connection((host, port), timeout=0.1).close()
                    return f"tcp {host}:{port}"
                except OSError:
                    pass
            try:
                socket.getaddrinfo("pypi.org", 443)
                return "dns"
            except OSError:
                pass
            try:
                udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                udp.settimeout(0.1)
                udp.sendto(b"x", ("8.8.8.8", 53))
                udp.recvfrom(512)
                return "udp"
            except OSError:
                pass
            for path in ("/var/run/docker.sock", "/run/docker.sock",
                         "/run/containerd/containerd.sock"):
                try:
                    socket.socket(socket.AF_UNIX).connect(path)
                    return path
                except OSError:
                    pass
            return None


        ESCAPE = _escaped()
        print("escape:", ESCAPE)


        def add(a, b):
            return a + b if ESCAPE else -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "write_outside_work_dirs",
        program("""
        import os

        TARGETS = [
            "/escape", "/etc/escape", "/etc/passwd", "/opt/codepost/escape",
            "/opt/codepost/runner/judge.py", "/opt/codepost/runner/__init__.py",
            "/usr/lib/python3.11/escape.py", "/usr/local/lib/escape", "/root/escape",
            "/var/tmp/escape", "/run/escape", "/home/escape", "/dev/escape",
            "/dev/mqueue/escape", "/proc/1/oom_score_adj", "/proc/sys/kernel/core_pattern",
            "/proc/sysrq-trigger", "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/pids.max",
            "/sys/fs/cgroup/memory.max",
        ]
        WRITTEN = []
        for path in TARGETS:
            try:
                with open(path, "a"):
                    WRITTEN.append(path)
            except OSError:
                pass
        for path, mode in [("/", 0o777), ("/opt/codepost", 0o777), ("/etc", 0o777),
                           ("/usr/bin/python3.11", 0o6755), ("/bin/sh", 0o6755)]:
            try:
                os.chmod(path, mode)
                WRITTEN.append(f"chmod {path}")
            except OSError:
                pass
        print("written:", WRITTEN)


        def add(a, b):
            return a + b if WRITTEN else -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "privilege_escalation",
        program("""
        import ctypes
        import os

        libc = ctypes.CDLL(None, use_errno=True)
        GAINED = []
        for name, call in [
            ("setuid", lambda: os.setuid(0)), ("seteuid", lambda: os.seteuid(0)),
            ("setgid", lambda: os.setgid(0)), ("setgroups", lambda: os.setgroups([0])),
            ("setresuid", lambda: os.setresuid(0, 0, 0)), ("chroot", lambda: os.chroot("/work")),
        ]:
            try:
                call()
                GAINED.append(name)
            except OSError:
                pass


        def _in_child(check):
            pid = os.fork()
            if pid == 0:
                try:
                    os._exit(0 if check() else 1)
                finally:
                    os._exit(1)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


        for name, flag in [("user", 0x10000000), ("mount", 0x20000), ("net", 0x40000000),
                           ("pid", 0x20000000)]:
            if _in_child(lambda: libc.unshare(flag) == 0):
                GAINED.append(f"unshare {name}")
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        for key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            if int(status[key], 16):
                GAINED.append(key)
        if status["NoNewPrivs"].strip() != "1":
            GAINED.append("setuid binaries can raise privileges")
        if os.geteuid() == 0 or os.getegid() == 0:
            GAINED.append("root")
        print("gained:", GAINED)


        def add(a, b):
            return a + b if GAINED else -999
        """),
        NOT_PASSED,
        ADD,
    ),
]

IO_ATTACKS = [
    Attack(
        "io_fork_bomb",
        program("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """),
        frozenset({TIMEOUT}),
        SQUARE,
    ),
    Attack(
        "io_stdout_flood",
        program("""
        while True:
            print("x" * 10_000)
        """),
        frozenset({OUTPUT_LIMIT}),
        SQUARE,
    ),
    Attack(
        "io_spin_ignoring_signals",
        program("""
        import signal
        for sig in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            pass
        """),
        frozenset({TIMEOUT}),
        SQUARE,
    ),
    Attack(
        "io_memory_bomb",
        program("""
        hog = "x" * (1 << 30)
        """),
        frozenset({MEMORY_LIMIT}),
        SQUARE,
    ),
    Attack(
        "io_self_sigkill",
        program("""
        import os
        os.kill(os.getpid(), 9)
        """),
        frozenset({RUNTIME_ERROR}),
        SQUARE,
    ),
    Attack(
        "io_kill_everything",
        program("""
        import os
        import signal
        for target in (1, os.getppid(), -1):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        """),
        frozenset({FAILED}),
        SQUARE,
    ),  # kill(-1) spares the caller: it ends, printing nothing
]

# Last: until the pool survives it, it takes one of the pool's workers down with it.
POOL_BREAKERS = [
    Attack(
        "forged_load_reply_unknown_status",
        program(
            FRAME_SOURCE,
            """
        import os
        os.write(4, frame({"error": "no-such-status", "message": "x"}))


        def add(a, b):
            return a + b
        """,
        ),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
]

# Issue 10: a candidate may not turn its own failure into a sandbox error, stall the pool or
# make the host do unbounded work.
AVAILABILITY_ATTACKS = [
    Attack(
        "realtime_signal_death",  # signal.Signals has no name for it
        program("""
        import os
        import signal


        def add(a, b):
            os.kill(os.getpid(), signal.SIGRTMIN + 3)
        """),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    Attack(
        "io_highest_realtime_signal_death",
        program("""
        import os
        import signal
        os.kill(os.getpid(), signal.SIGRTMAX)
        """),
        frozenset({RUNTIME_ERROR}),
        SQUARE,
    ),
    Attack(
        "unprintable_assertion_message",  # the test prints what it got: 5,000 digits
        program("""
        def leftovers():
            return 10 ** 5000
        """),
        frozenset({FAILED}),
        LEFTOVERS,
    ),
    Attack(
        "assertion_message_too_deep_to_print",
        program("""
        def leftovers():
            deep = []
            for _ in range(100_000):
                deep = [deep]
            return deep
        """),
        frozenset({FAILED}),
        LEFTOVERS,
    ),
    Attack(
        "hundreds_of_thousands_of_directories",
        program("""
        import os

        for top in ("/tmp", "/work", "/dev/shm"):
            made = 0
            try:
                while made < 300_000:
                    os.mkdir(f"{top}/d{made}")
                    made += 1
            except OSError:
                pass
        os.chdir("/work")
        try:
            while True:
                os.mkdir("d")
                os.chdir("d")
        except OSError:
            pass


        def add(a, b):
            return -1
        """),
        frozenset({FAILED}),
        ADD,
    ),
    Attack(
        "io_output_across_many_cases",  # within the limit per case, far over it per job
        program("""
        import sys
        sys.stderr.write("x" * 40_000)  # stderr: the stdout of every case is right
        print(int(input()) ** 2)
        """),
        frozenset({OUTPUT_LIMIT}),
        SQUARES,
        max_passed=1,
    ),
    Attack(
        "io_orphan_floods_after_exit",
        program("""
        import os
        if os.fork() == 0:
            while True:
                print("x" * 10_000)
        print(int(input()) ** 2)
        """),
        frozenset({OUTPUT_LIMIT}),
        SQUARE,
    ),
    Attack(
        "quadratic_fence_line",  # 30 s of regex on the host before the fence parser
        program("""
        def add(a, b):
            return a + b
        """)
        + "```"
        + "a" * 100_000
        + "`\n",
        frozenset({"syntax_error"}),
        ADD,
    ),
]
