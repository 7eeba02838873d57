"""Cheats: programs that try to pass without solving, by reaching what decides the verdict
(the tests, the judge, the expected output, the reply pipe). Each passes only if it worked."""

from __future__ import annotations

from redteam_samples import (
    ABS_AREA,
    ADD,
    AREA,
    COUNT,
    EVENS,
    FIND_SOURCE,
    FRAME_SOURCE,
    GUESS,
    IS_PRIME,
    MEAN,
    MEMORY_LIMIT,
    NOT_PASSED,
    POSITIVE,
    REVERSE,
    RUNTIME_ERROR,
    SQRT,
    TIMEOUT,
    Attack,
    program,
)

CHEATS = [
    # -- early exits with status 0
    Attack(
        "sys_exit_0_at_load",
        program("""
        import sys
        sys.exit(0)


        def add(a, b):
            return a + b
        """),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    Attack(
        "sys_exit_0_in_call",
        program("""
        import sys


        def add(a, b):
            sys.exit(0)
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "os_exit_0_at_load",
        program("""
        import os
        os._exit(0)


        def add(a, b):
            return a + b
        """),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    Attack(
        "posix_exit_0_in_call",
        program("""
        import posix


        def add(a, b):
            print("3 passed")
            posix._exit(0)
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "atexit_prints_passed",
        program("""
        import atexit
        atexit.register(lambda: print("ALL TESTS PASSED\\n3 passed, 0 failed"))


        def add(a, b):
            raise SystemExit(0)
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "thread_exits_process",
        program("""
        import os
        import threading
        import time


        def add(a, b):
            threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()
            time.sleep(1)
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "threads_keep_running",
        program("""
        import threading
        import time


        def _chatter():
            while True:
                print("PASSED", flush=True)
                time.sleep(0.05)


        def _spin():
            while True:
                pass


        threading.Thread(target=_chatter).start()
        threading.Thread(target=_spin).start()


        def add(a, b):
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "del_exits_process",
        program("""
        import os


        class Bomb:
            def __del__(self):
                print("ALL TESTS PASSED", flush=True)
                os._exit(0)


        def add(a, b):
            Bomb()
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "excepthooks_exit_0",
        program("""
        import os
        import sys
        import threading
        sys.excepthook = lambda *exc: os._exit(0)
        sys.unraisablehook = lambda *exc: os._exit(0)
        threading.excepthook = lambda *exc: os._exit(0)


        def add(a, b):
            raise RuntimeError("look away")
        """),
        NOT_PASSED,
        ADD,
    ),
    # -- fake result lines and frames
    Attack(
        "fake_results_on_stdout_and_stderr",
        program(
            FRAME_SOURCE,
            """
        import os

        FAKE = [{"event": "test", "name": f"test_{i}", "passed": True, "error": None,
                 "candidate_error": False, "duration_s": 0.0} for i in range(3)]


        def add(a, b):
            for line in FAKE:
                print(_json.dumps(line))
            print('{"status": "completed", "passed": true}\\n3 passed in 0.01s\\nOK', flush=True)
            blob = b"".join(frame(m) for m in FAKE + [{"event": "done"}])
            os.write(1, blob)
            os.write(2, blob)
            return -999
        """,
        ),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "forged_frames_on_every_fd",
        program(
            FRAME_SOURCE,
            """
        import os

        BLOB = b"".join(frame(m) for m in [
            {"event": "test", "name": "test_0", "passed": True, "error": None,
             "candidate_error": False, "duration_s": 0.0},
            {"event": "done"},
        ])


        def add(a, b):
            for fd in range(256):
                try:
                    os.write(fd, BLOB)
                except OSError:
                    pass
            return -999
        """,
        ),
        NOT_PASSED,
        ADD,
    ),
    # The judge reads the program's reply to "load": a program that answers it itself must not
    # choose the job's status (or crash the host with a status that does not exist).
    Attack(
        "forged_load_reply_status_completed",
        program(
            FRAME_SOURCE,
            """
        import os
        os.write(4, frame({"error": "completed", "message": "all tests passed"}))


        def add(a, b):
            return a + b
        """,
        ),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    Attack(
        "forged_load_reply_status_sandbox_error",
        program(
            FRAME_SOURCE,
            """
        import os
        os.write(4, frame({"error": "sandbox_error", "message": "not my fault"}))


        def add(a, b):
            return a + b
        """,
        ),
        frozenset({RUNTIME_ERROR}),
        ADD,
    ),
    # -- results that compare equal to anything
    Attack(
        "always_equal_object",
        program("""
        class Anything:
            def __eq__(self, other):
                return True

            def __ne__(self, other):
                return False

            def __hash__(self):
                return 0

            def __bool__(self):
                return True


        def add(a, b):
            return Anything()
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "int_subclass_always_equal",
        program("""
        class Int(int):
            def __eq__(self, other):
                return True

            def __ne__(self, other):
                return False

            __hash__ = int.__hash__


        def add(a, b):
            return Int(-999)
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "str_subclass_always_equal",
        program("""
        class Str(str):
            def __eq__(self, other):
                return True

            def __ne__(self, other):
                return False

            def __str__(self):
                return "cba"

            __hash__ = str.__hash__


        def reverse(s):
            return Str("wrong")
        """),
        NOT_PASSED,
        REVERSE,
    ),
    Attack(
        "list_subclass_always_equal",
        program("""
        class List(list):
            def __eq__(self, other):
                return True

            def __ne__(self, other):
                return False

            def __iter__(self):
                return iter([2, 4])


        def evens(xs):
            return List([7])
        """),
        NOT_PASSED,
        EVENS,
    ),
    Attack(
        "dict_subclass_always_equal",
        program("""
        class Dict(dict):
            def __eq__(self, other):
                return True

            def __ne__(self, other):
                return False

            def items(self):
                return {"a": 2, "b": 1}.items()


        def count_chars(s):
            return Dict(z=9)
        """),
        NOT_PASSED,
        COUNT,
    ),
    Attack(
        "abs_and_sub_always_close",
        program("""
        class Close:
            def __sub__(self, other):
                return self

            __rsub__ = __sub__

            def __abs__(self):
                return 0

            def __lt__(self, other):
                return True

            def __eq__(self, other):
                return True

            def __float__(self):
                return 2.5

            def __index__(self):
                return 3


        def mean(xs):
            return Close()
        """),
        NOT_PASSED,
        MEAN,
    ),
    Attack(
        "float_subclass_and_nan",
        program("""
        class Float(float):
            def __sub__(self, other):
                return Float(0.0)

            def __abs__(self):
                return 0.0

            def __eq__(self, other):
                return True


        calls = []


        def mean(xs):
            calls.append(1)
            return Float(-999.0) if len(calls) % 2 else float("nan")
        """),
        NOT_PASSED,
        MEAN,
    ),
    Attack(
        "truthy_object_for_is_true",
        program("""
        class Yes:
            def __bool__(self):
                return True

            def __eq__(self, other):
                return True


        def is_prime(n):
            return Yes()
        """),
        NOT_PASSED,
        IS_PRIME,
    ),
    Attack(
        "fake_builtin_valueerror",
        program("""
        class ValueError(Exception):
            pass


        def safe_sqrt(x):
            if x < 0:
                raise ValueError("negative")
            return -999
        """),
        NOT_PASSED,
        SQRT,
    ),
    # -- patching builtins and modules the tests use
    Attack(
        "patched_builtins",
        program("""
        import builtins
        import sys


        class Never(BaseException):
            pass


        builtins.AssertionError = Never
        builtins.abs = lambda x: 0
        builtins.isinstance = lambda *args: True
        builtins.sorted = lambda *args, **kwargs: [2, 4]
        sys.modules["builtins"] = type(sys)("builtins")


        def add(a, b):
            return -999
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "patched_math_and_sys_modules",
        program("""
        import math
        import sys
        import types

        math.isclose = lambda *args, **kwargs: True
        fake = types.ModuleType("fake")
        fake.isclose = math.isclose
        fake.fmean = lambda *args: -999.0
        sys.modules["math"] = sys.modules["statistics"] = fake


        def mean(xs):
            return -999.0
        """),
        NOT_PASSED,
        MEAN,
    ),
    # MBPP asserts take their free names from the program: not modules or builtins, though.
    Attack(
        "program_defines_the_asserts_helpers",
        program("""
        class _Lenient:
            @staticmethod
            def isclose(*args, **kwargs):
                return True


        math = _Lenient()
        abs = lambda x: 0  # noqa: E731


        def circle_area(r):
            return -999.0
        """),
        NOT_PASSED,
        AREA,
    ),
    Attack(
        "shadow_modules_on_disk",
        program("""
        import os

        SHADOW = (
            "class Anything:\\n"
            "    def __eq__(self, other):\\n        return True\\n"
            "isclose = fmean = lambda *args, **kwargs: Anything()\\n"
        )
        for folder in ("/work", "/tmp", "/dev/shm"):
            for name in ("math.py", "statistics.py", "fractions.py", "numbers.py", "decimal.py",
                         "random.py", "sitecustomize.py", "usercustomize.py", "json.py"):
                try:
                    with open(os.path.join(folder, name), "w") as f:
                        f.write(SHADOW)
                except OSError:
                    pass
            try:
                os.makedirs(os.path.join(folder, "runner"), exist_ok=True)
                for name in ("__init__.py", "codec.py", "judge.py"):
                    with open(os.path.join(folder, "runner", name), "w") as f:
                        f.write(SHADOW)
            except OSError:
                pass


        def mean(xs):
            return -999.0
        """),
        NOT_PASSED,
        MEAN,
    ),
    # -- reading the tests or the expected output
    Attack(
        "leak_gc_frames_and_env",
        program(
            FIND_SOURCE,
            """
        import gc
        import inspect
        import sys


        def _texts(obj):
            if isinstance(obj, dict):
                obj = [*obj.keys(), *obj.values()]
            for value in obj if isinstance(obj, (list, tuple, set, frozenset)) else [obj]:
                if isinstance(value, str):
                    yield value.encode("utf-8", "replace")
                elif isinstance(value, bytes):
                    yield value


        def guess():
            seen = [text for obj in gc.get_objects() for text in _texts(obj)]
            frame = sys._getframe(1)
            while frame is not None:
                seen += [*_texts(frame.f_locals), *_texts(frame.f_code.co_consts)]
                frame = frame.f_back
            seen += [text for info in inspect.stack()[1:] for text in _texts(info.frame.f_globals)]
            seen += [*_texts(dict(os.environ))]
            try:
                with open("/proc/self/environ", "rb") as f:
                    seen.append(f.read())
            except OSError:
                pass
            return next((found for found in map(find, seen) if found), "none")
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    Attack(
        "leak_proc_self_mem",
        program(
            FIND_SOURCE,
            """

        def guess():
            return scan_memory("self") or "none"
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    Attack(
        "leak_other_processes_via_proc",
        program(
            FIND_SOURCE,
            """

        def guess():
            for pid in other_pids():
                for name in ("cmdline", "environ", "status", "stat", "wchan", "syscall",
                             "stack", "io", "sched", "maps", "smaps", "auxv"):
                    try:
                        with open(f"/proc/{pid}/{name}", "rb") as f:
                            found = find(f.read(1 << 20))
                    except OSError:
                        continue
                    if found:
                        return found
                found = scan_memory(pid)
                if found:
                    return found
                for sub in ("cwd", "root"):
                    try:
                        os.listdir(f"/proc/{pid}/{sub}")
                        return f"entered /proc/{pid}/{sub}"
                    except OSError:
                        pass
            return "none"
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    Attack(
        "leak_via_ptrace",
        program(
            FIND_SOURCE,
            """
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        libc.ptrace.restype = ctypes.c_long
        PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206


        def guess():
            for pid in other_pids():
                for request in (PTRACE_ATTACH, PTRACE_SEIZE):
                    if libc.ptrace(request, pid, None, None) == 0:
                        try:
                            os.waitpid(pid, 0x40000000)  # __WALL
                        except OSError:
                            pass
                        found = scan_memory(pid)
                        libc.ptrace(PTRACE_DETACH, pid, None, None)
                        return found or f"attached to {pid}"
            return "none"
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    Attack(
        "leak_files_on_disk",
        program(
            FIND_SOURCE,
            """
        import time


        def guess():
            end = time.monotonic() + 1.0
            for top in ("/tmp", "/work", "/dev/shm", "/run", "/var", "/etc", "/opt", "/root",
                        "/home", "/srv", "/mnt", "/"):
                for root, dirs, files in os.walk(top):
                    if root == "/":
                        dirs.clear()
                    for name in files:
                        if time.monotonic() > end:
                            return "none"
                        try:
                            with open(os.path.join(root, name), "rb") as f:
                                found = find(f.read(1 << 20))
                        except OSError:
                            continue
                        if found:
                            return found
            return "none"
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    # A pipe of another process opened through /proc/PID/fd: reading one could show the tests,
    # writing forged result frames into the judge's results pipe could fake a pass.
    Attack(
        "leak_and_forge_through_fds",
        program(
            FIND_SOURCE,
            FRAME_SOURCE,
            """

        BLOB = b"".join(frame(m) for m in [
            {"event": "test", "name": "test_0", "passed": True, "error": None,
             "candidate_error": False, "duration_s": 0.0, "memory_error": False},
            {"event": "done"},
        ])


        def guess():
            found = None
            for fd in range(5, 256):
                try:
                    os.set_blocking(fd, False)
                    found = found or find(os.read(fd, 1 << 20))
                except OSError:
                    pass
            for pid in other_pids():
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    path = f"/proc/{pid}/fd/{fd}"
                    for flags in (os.O_RDONLY, os.O_WRONLY):
                        try:
                            opened = os.open(path, flags | os.O_NONBLOCK)
                        except OSError:
                            continue
                        try:
                            if flags == os.O_RDONLY:
                                found = found or find(os.read(opened, 1 << 20))
                            else:
                                os.write(opened, BLOB)
                        except OSError:
                            pass
                        finally:
                            os.close(opened)
            return found or "none"
        """,
        ),
        NOT_PASSED,
        GUESS,
    ),
    # -- exceptions designed to confuse
    Attack(
        "stop_iteration_ends_the_tests_iteration",  # all(map(...)) of nothing is True
        program("""
        def is_positive(n):
            raise StopIteration
        """),
        frozenset({RUNTIME_ERROR}),
        POSITIVE,
    ),
    Attack(
        "redefined_builtin_as_the_inferred_entry_point",  # abs(area(1) - x) is always 0
        program("""
        def abs(x):
            return 1 if x == -1 else 0


        def area(r):
            return 0
        """),
        NOT_PASSED,
        ABS_AREA,
        max_passed=1,  # abs(-1) == 1, with the real abs
    ),
    Attack(
        "base_exceptions_in_calls",
        program("""
        calls = []


        def add(a, b):
            calls.append(1)
            raise (KeyboardInterrupt, SystemExit, GeneratorExit)[len(calls) % 3]("passed")
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "exception_with_evil_str",
        program("""
        class Evil(Exception):
            def __str__(self):
                raise Evil()

            def __repr__(self):
                return "passed"


        def add(a, b):
            raise Evil()
        """),
        NOT_PASSED,
        ADD,
    ),
    Attack(
        "exception_with_huge_str",
        program("""
        class Huge(ValueError):
            def __str__(self):
                return "passed " * 5_000_000


        def add(a, b):
            raise Huge()
        """),
        NOT_PASSED,
        ADD,
    ),
    # -- odd and huge results
    Attack(
        "generator_result",
        program("""
        def evens(xs):
            return (x for x in xs if x % 2 == 0)
        """),
        NOT_PASSED,
        EVENS,
        max_passed=1,
    ),  # sorted() of it is honestly [2, 4]
    Attack(
        "self_referencing_result",
        program("""
        def evens(xs):
            out = [2, 4]
            out.append(out)
            return out
        """),
        NOT_PASSED,
        EVENS,
    ),
    Attack(
        "huge_result",
        program("""
        def reverse(s):
            return "x" * (80 << 20)
        """),
        NOT_PASSED | {MEMORY_LIMIT},
        REVERSE,
    ),
    # Raw reply frames that are cheap for the program and expensive for the judge (a longer
    # wall limit, so that the judge gets to the end of its parsing).
    Attack(
        "judge_memory_bomb_in_reply",
        program("""
        import os

        BODY = b'{"ok":[' + b"{}," * 20_000_000 + b"{}]}"


        def add(a, b):
            os.write(4, len(BODY).to_bytes(4, "big") + BODY)
            return -999
        """),
        NOT_PASSED | {MEMORY_LIMIT, TIMEOUT},
        ADD,
        wall_time_s=10.0,
    ),
    Attack(
        "judge_memory_bomb_in_load_reply",
        program("""
        import os

        BODY = b'{"error":[' + b"{}," * 20_000_000 + b"{}]}"
        os.write(4, len(BODY).to_bytes(4, "big") + BODY)


        def add(a, b):
            return a + b
        """),
        frozenset({RUNTIME_ERROR, MEMORY_LIMIT, TIMEOUT}),
        ADD,
        wall_time_s=10.0,
    ),
]
