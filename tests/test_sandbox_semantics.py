"""Correct Python values survive the judge: what a test sees across the RPC is what it would
see in one process (issue 10, classes 7-11 and 13), for real in the Docker sandbox."""

from __future__ import annotations

import pytest

from codepost.sandbox import ExecStatus, Job, JudgeSpec, Limits

pytestmark = pytest.mark.docker

FAST = Limits(wall_time_s=5.0, cpu_time_s=5.0, memory_mb=256, output_bytes=64_000)


def run_tests(pool, program: str, *tests: str, setup: str = "f = __remote__('f')") -> list:
    result = pool.run(Job(program=program, judge=JudgeSpec(setup=setup, tests=tests), limits=FAST))
    assert result.status is ExecStatus.COMPLETED, result
    return [(test.passed, test.error) for test in result.tests]


def all_pass(pool, program: str, *tests: str, setup: str = "f = __remote__('f')") -> None:
    outcomes = run_tests(pool, program, *tests, setup=setup)
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
