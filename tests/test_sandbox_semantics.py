"""Correct Python values survive the judge: what a test sees across the RPC is what it would
see in one process (issue 10, classes 7-11 and 13), for real in the Docker sandbox."""

from __future__ import annotations

import pytest

from codepost.sandbox import ExecStatus, Job, JudgeSpec, Limits

pytestmark = pytest.mark.docker

FAST = Limits(wall_time_s=5.0, cpu_time_s=5.0, memory_mb=256, output_bytes=64_000)


def run_tests(
    pool, program: str, *tests: str, setup: str = "f = __remote__('f')", limits: Limits = FAST
) -> list:
    job = Job(program=program, judge=JudgeSpec(setup=setup, tests=tests), limits=limits)
    result = pool.run(job)
    assert result.status is ExecStatus.COMPLETED, result
    return [(test.passed, test.error) for test in result.tests]


def all_pass(
    pool, program: str, *tests: str, setup: str = "f = __remote__('f')", limits: Limits = FAST
) -> None:
    outcomes = run_tests(pool, program, *tests, setup=setup, limits=limits)
    assert all(passed for passed, _ in outcomes), outcomes


def test_custom_exceptions_are_their_builtin_bases(sandbox_pool):
    program = (
        "class MyErr(ValueError):\n    pass\n"
        "class Both(KeyError, TypeError):\n    pass\n"
        "def f(kind):\n"
        "    raise {'my': MyErr('bad value'), 'both': Both('k'), 'key': KeyError('k')}[kind]\n"
    )
    all_pass(
        sandbox_pool,
        program,
        "try:\n    f('my')\nexcept ValueError as e:\n"
        "    assert type(e).__name__ == 'MyErr' and str(e) == 'bad value'\n"
        "else:\n    raise AssertionError('not raised')",
        "try:\n    f('both')\nexcept TypeError:\n    pass",
        "try:\n    f('both')\nexcept KeyError:\n    pass",
        "try:\n    f('key')\nexcept KeyError as e:\n    assert str(e) == \"'k'\", str(e)",
    )


def test_integers_past_4300_digits_both_ways(sandbox_pool):
    all_pass(
        sandbox_pool,
        "def f(n):\n    return n * 10 ** 5000\n",
        "assert f(3) == 3 * 10 ** 5000",
        "assert f(10 ** 6000) == 10 ** 11000",
        setup="import sys\nf = __remote__('f')",
    )


def test_io_programs_print_integers_of_any_size(sandbox_pool):
    job = Job(program="print(7 ** 10000)\n", stdin_cases=("",), limits=FAST)
    (case,) = sandbox_pool.run(job).cases
    digits = case.stdout.strip()
    assert case.status is ExecStatus.COMPLETED and len(digits) == 8451  # 7 ** 10000
    assert digits.endswith(str(7**10000 % 10**12).zfill(12))


STDLIB_PROGRAM = """
import collections, datetime, decimal, fractions

Point = collections.namedtuple("Point", "x y")


def f(kind):
    d = {"a": 1, "b": 2}
    return {
        "fraction": fractions.Fraction(1, 3),
        "decimal": decimal.Decimal("1.10"),
        "keys": d.keys(),
        "items": d.items(),
        "ordered": collections.OrderedDict(b=1, a=2),
        "counter": collections.Counter("aab"),
        "deque": collections.deque([1, 2, 3], maxlen=3),
        "defaultdict": collections.defaultdict(list, {"x": [1]}),
        "point": Point(1, 2),
        "date": datetime.date(2024, 2, 29),
        "datetime": datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
        "delta": datetime.timedelta(hours=25),
    }[kind]
"""


@pytest.mark.parametrize(
    "test",
    [
        "assert f('fraction') == Fraction(1, 3) and type(f('fraction')) is Fraction",
        "assert str(f('decimal')) == '1.10' and f('decimal') == Decimal('1.1')",
        "assert f('keys') == {'a', 'b'}",
        "assert f('items') == {('a', 1), ('b', 2)}",
        "assert f('ordered') == OrderedDict(b=1, a=2) and list(f('ordered')) == ['b', 'a']",
        "assert f('counter').most_common(1) == [('a', 2)]",
        "assert f('deque') == deque([1, 2, 3]) and f('deque').maxlen == 3",
        "assert f('defaultdict')['missing'] == []",
        "assert f('point') == (1, 2) and f('point').x == 1 and type(f('point')).__name__ == 'Point'",
        "assert f('date') == date(2024, 2, 29) and f('date').isoformat() == '2024-02-29'",
        "assert f('datetime') - datetime(2024, 1, 2, tzinfo=timezone.utc) == timedelta(hours=3, minutes=4)",
        "assert f('delta').days == 1",
    ],
)
def test_standard_library_values_arrive_as_themselves(sandbox_pool, test):
    setup = (
        "from collections import OrderedDict, deque\n"
        "from datetime import date, datetime, timedelta, timezone\n"
        "from decimal import Decimal\nfrom fractions import Fraction\n"
        "f = __remote__('f')\n"
    )
    all_pass(sandbox_pool, STDLIB_PROGRAM, test, setup=setup)


def test_standard_library_values_reach_the_program_as_themselves(sandbox_pool):
    all_pass(
        sandbox_pool,
        "def f(x):\n    return type(x).__name__\n",
        "assert f(Fraction(1, 2)) == 'Fraction'",
        "assert f(deque([1])) == 'deque'",
        "assert f({1: 2}.keys()) == 'dict_keys'",
        setup="from collections import deque\nfrom fractions import Fraction\nf = __remote__('f')",
    )


def test_arguments_changed_in_place_change_in_the_test(sandbox_pool):
    program = (
        "def f(xs, grid, d, s, *, out):\n"
        "    xs.sort()\n    grid[0][1] = 9\n    d['new'] = 1\n    s.add(4)\n    out.append('done')\n"
        "def g(xs):\n    xs.append(1)\n    raise ValueError('after the change')\n"
    )
    all_pass(
        sandbox_pool,
        program,
        "xs, grid, d, s, out = [3, 1, 2], [[0, 0], [0, 0]], {}, {1}, []\n"
        "row = grid[0]\n"
        "f(xs, grid, d, s, out=out)\n"
        "assert xs == [1, 2, 3] and grid == [[0, 9], [0, 0]] and row is grid[0] and row[1] == 9\n"
        "assert d == {'new': 1} and s == {1, 4} and out == ['done']",
        "ys = []\ntry:\n    g(ys)\nexcept ValueError:\n    pass\nassert ys == [1]",
        setup="f = __remote__('f')\ng = __remote__('g')",
    )


def test_deeply_nested_data_round_trips(sandbox_pool):
    all_pass(
        sandbox_pool,
        "def f(x):\n    return [x]\n",
        "deep = []\nfor _ in range(600):\n    deep = [deep]\nassert f(deep) == [deep]",
    )


def test_a_child_writing_just_after_its_parent_exits_is_counted(sandbox_pool):
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n    time.sleep(0.2)\n    print('from the child', flush=True)\n"
        "    os._exit(0)\n"
        "print('from the parent', flush=True)\n"
    )
    (case,) = sandbox_pool.run(Job(program=program, stdin_cases=("",), limits=FAST)).cases
    assert case.status is ExecStatus.COMPLETED
    assert case.stdout.splitlines() == ["from the parent", "from the child"]


def test_a_child_that_keeps_the_output_open_is_cut_off_and_named(sandbox_pool):
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\nprint('done', flush=True)\n"
    )
    result = sandbox_pool.run(Job(program=program, stdin_cases=("",), limits=FAST))
    (case,) = result.cases
    assert case.status is ExecStatus.COMPLETED and case.stdout == "done\n"
    assert "still holding stdout" in case.stderr
    assert case.duration_s < 2.0


# -- programs run as `python3 program.py` runs them, or as importing them does (issue 17, class 1)


def test_dataclasses_and_annotations_as_in_an_imported_module(sandbox_pool):
    program = (
        "from dataclasses import dataclass, field\n"
        "@dataclass\nclass Point:\n    x: int\n    tags: list = field(default_factory=list)\n"
        "def f(x: int) -> int:\n    return Point(x).x\n"
        "def g():\n    return f.__annotations__['x'] is int  # not the runner's string\n"
    )
    setup = "f, g = __remote__('f'), __remote__('g')"
    all_pass(sandbox_pool, program, "assert f(3) == 3", "assert g() is True", setup=setup)
    postponed = "from __future__ import annotations\n" + program.replace("is int", "== 'int'")
    all_pass(sandbox_pool, postponed, "assert f(3) == 3", "assert g() is True", setup=setup)


def io_run(pool, program: str, stdin: str = ""):
    (case,) = pool.run(Job(program=program, stdin_cases=(stdin,), limits=FAST)).cases
    return case


@pytest.mark.parametrize(
    ("program", "stdout"),
    [
        ("print(1)\nexit()\nprint(2)\n", "1\n"),
        ("print(1)\nquit(0)\n", "1\n"),
        (  # competitive programming: main in a thread with a big stack
            "import sys, threading\n"
            "def main():\n    print(sum(map(int, sys.stdin.read().split())))\n"
            "sys.setrecursionlimit(10 ** 6)\nthreading.stack_size(1 << 26)\n"
            "threading.Thread(target=main).start()\n",
            "6\n",
        ),
        ("import atexit\natexit.register(print, 'at exit')\nprint('first')\n", "first\nat exit\n"),
        ("import sys\nsys.__stdout__.write('unflushed\\n')\n", "unflushed\n"),
        (
            "import multiprocessing\n"
            "def square(x):\n    return x * x\n"
            "if __name__ == '__main__':\n"
            "    with multiprocessing.Pool(2) as pool:\n        print(pool.map(square, [1, 2, 3]))\n",
            "[1, 4, 9]\n",
        ),
    ],
    ids=["exit", "quit", "thread", "atexit", "dunder-stdout", "multiprocessing"],
)
def test_io_programs_end_as_python_ends_them(sandbox_pool, program, stdout):
    case = io_run(sandbox_pool, program, "1 2 3\n")
    assert (case.status, case.stdout) == (ExecStatus.COMPLETED, stdout), case


def test_multiprocessing_over_a_function_of_the_program_in_call_mode(sandbox_pool):
    program = (
        "import multiprocessing\n"
        "def square(x):\n    return x * x\n"
        "def f(xs):\n    with multiprocessing.Pool(2) as pool:\n        return pool.map(square, xs)\n"
    )
    all_pass(sandbox_pool, program, "assert f([1, 2, 3]) == [1, 4, 9]")


def test_candidate_iterators_are_read_as_the_test_reads_them(sandbox_pool):
    program = (
        "import itertools\n"
        "def f():\n    n = 0\n    while True:\n        yield n\n        n += 1\n"
        "def g(n):\n    return (x * x for x in range(n))\n"
        "def h():\n    yield 1\n    raise KeyError('after one')\n"
    )
    all_pass(
        sandbox_pool,
        program,
        "assert list(itertools.islice(f(), 5)) == [0, 1, 2, 3, 4]",
        "it = f()\nassert next(it) == 0 and next(it) == 1",
        "assert sum(g(300_000)) == sum(x * x for x in range(300_000))",
        "it = h()\nassert next(it) == 1\ntry:\n    next(it)\nexcept KeyError:\n    pass\n"
        "else:\n    raise AssertionError('no KeyError')\nassert list(it) == []",
        setup="import itertools\nf, g, h = __remote__('f'), __remote__('g'), __remote__('h')",
    )


def test_objects_answer_for_themselves_but_equal_no_expected_value(sandbox_pool):
    program = (
        "class Node:\n"
        "    def __init__(self, v):\n        self.v = v\n"
        "    def __eq__(self, other):\n        return isinstance(other, Node) and other.v == self.v\n"
        "    def __hash__(self):\n        return hash(self.v)\n"
        "    def __str__(self):\n        return f'Node({self.v})'\n"
        "    __repr__ = __str__\n"
        "    def __len__(self):\n        return self.v\n"
        "def f(v):\n    return Node(v)\n"
    )
    all_pass(
        sandbox_pool,
        program,
        "assert f(1) == f(1) and f(1) != f(2) and len({f(1), f(1), f(2)}) == 2",
        "assert str(f(3)) == 'Node(3)' and repr(f(3)) == 'Node(3)' and f'{f(3)}' == 'Node(3)'",
        "assert f(2) and not f(0)",
        "assert f(1) != 1 and not (f(1) == 'Node(1)')",  # expected values are never equal
    )


def test_results_of_millions_of_items(sandbox_pool):
    """Under the default limits; a result too large to send says so (not "broke the
    protocol", not an exception the program never raised)."""
    program = (
        "def f(n):\n    return list(range(n))\n"
        "def g(n):\n    return ['ab'] * n\n"
        "def too_many():\n    return [0] * 20_000_000\n"
        "def too_long():\n    return ['x' * 100] * 1_000_000\n"
    )
    setup = "\n".join(
        f"{name} = __remote__({name!r})" for name in ("f", "g", "too_many", "too_long")
    )
    outcomes = run_tests(
        sandbox_pool,
        program,
        "assert f(5_000_000) == list(range(5_000_000))",
        "assert len(g(3_000_000)) == 3_000_000",
        "too_many()",
        "too_long()",
        setup=setup,
        limits=Limits(),
    )
    assert [passed for passed, _ in outcomes] == [True, True, False, False], outcomes
    assert "cannot be sent" in outcomes[2][1] and "more than 16000000 items" in outcomes[2][1]
    assert "cannot be sent" in outcomes[3][1] and "byte limit" in outcomes[3][1]


def test_the_judge_reads_the_programs_public_names(sandbox_pool):
    """``__remote_names__()`` (the call and pytest judges use it) lists the program's public
    top-level names; it was decoded as a value and failed for any but one name."""
    all_pass(
        sandbox_pool,
        "import os\n\ndef f():\n    pass\n\nclass Solution:\n    pass\n\n_hidden = 1\nvalue = 2\n",
        "assert sorted(__remote_names__()) == ['Solution', 'f', 'value']",
    )
