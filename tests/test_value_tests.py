"""Value tests (``JudgeSpec.values``): tests that are plain data are decided without a judge
process, with the outcomes the judge gives for their code. The extraction and the replay run
here (fast); the comparison with the judge runs in the Docker sandbox."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import fractions
import time

import psutil
import pytest

from codepost.sandbox import (
    ExecStatus,
    Job,
    JudgeSpec,
    Limits,
    PoolConfig,
    SandboxPool,
    ValueCase,
)
from codepost.sandbox.pool import _host_deadline, _job_payload
from codepost.sandbox.runner.codec import encode
from codepost.sandbox.runner.judge import (
    HASHED_TOKENS,
    Replay,
    cheap_to_decide,
    read_replies,
    run_values,
)
from codepost.sandbox.runner.wire import PeerClosed, ProtocolError, frame, frames_in
from codepost.verifiers.forms.asserts import asserts_judge
from codepost.verifiers.forms.check import check_judge, values_of
from codepost.verifiers.judges import may_rebind, value_case
from codepost.verifiers.problems import Problem, load_problems

FAST = Limits(wall_time_s=2.0, cpu_time_s=4.0, memory_mb=256, output_bytes=64_000)  # wall first
TESTS = (
    "assert f(1, 2) == 3\n",
    "assert f(2, 2) == 4, 'two and two'\n",
    "assert True, 'always'\n",
    "assert f((1, 2), None) == (1, 2)\n",
    "assert f(10 ** 30, 1) == 10 ** 30 + 1\n",
)
VALUES = (
    ValueCase((1, 2), 3),
    ValueCase((2, 2), 4, "two and two"),
    ValueCase(None, True, "always"),
    ValueCase(((1, 2), None), (1, 2)),
    ValueCase((10**30, 1), 10**30 + 1),
)
ADD = "def f(a, b):\n    return a if b is None else a + b\n"
# Programs whose every outcome (status, each test's pass, error and blame, the output) must be
# the judge's.
PROGRAMS = {
    "right": ADD,
    "wrong": "def f(a, b):\n    return 0\n",
    "a list for a tuple": "def f(a, b):\n    return list(a) if b is None else a + b\n",
    "raises": "def f(a, b):\n    raise ValueError(f'no {a}')\n",
    "a custom exception": "class E(KeyError):\n    pass\ndef f(a, b):\n    raise E('k')\n",
    "no such function": "def g():\n    pass\n",
    "not a function": "f = 5\n",
    "a generator": "def f(a, b):\n    yield a\n",
    "state across calls": "n = 0\ndef f(a, b):\n    global n\n    n += 1\n    return n\n",
    "exits in a call": "import os\ndef f(a, b):\n    print('bye', flush=True)\n    os._exit(3)\n",
    "killed in the second call": (
        "import os, signal\nn = 0\ndef f(a, b):\n    global n\n    n += 1\n"
        "    if n == 2:\n        os.kill(os.getpid(), signal.SIGSEGV)\n    return a + b\n"
    ),
    "loops": "def f(a, b):\n    while True:\n        pass\n",
    "syntax error": "def f(:\n",
    "fails to load": "raise RuntimeError('at load')\n",
    # stops in its call, so the limit, not the pipes' timing, decides where the tests end
    "prints past the limit": (
        "import time\ndef f(a, b):\n    print('x' * 100_000, flush=True)\n    time.sleep(10)\n"
    ),
    "memory": "def f(a, b):\n    return bytearray(1 << 30)\n",
    "a child holds the pipes": (
        "import os, time\nif os.fork() == 0:\n    time.sleep(2)\n    os._exit(0)\n" + ADD
    ),
    "changes its arguments": "def f(a, b):\n    if isinstance(a, list): a.append(1)\n    return 3\n",
}


def outcomes(result) -> tuple:
    return (
        result.status,
        [(t.name, t.passed, t.error, t.candidate_error) for t in result.tests],
        result.stdout,
        result.error and result.error.split(" (and ")[0],  # the time it waited for a CPU
    )


def run_both(pool, program: str, setup: str = "f = __remote__('f')\n", values=VALUES, tests=TESTS):
    judged, valued = (
        pool.run(
            Job(
                program=program,
                judge=JudgeSpec(setup=setup, tests=tests, target="f", values=cases),
                limits=FAST,
            )
        )
        for cases in (None, values)
    )
    return judged, valued


@pytest.mark.docker
@pytest.mark.parametrize("program", PROGRAMS.values(), ids=list(PROGRAMS))
def test_value_tests_decide_as_the_judge_does(sandbox_pool, program):
    judged, valued = run_both(sandbox_pool, program)
    assert outcomes(valued) == outcomes(judged)


# Asserts of the other shapes value tests take: folded literals, `is`, `abs(...) < tolerance`.
SHAPES = (
    "assert f(3 * 19, -(2 ** 3)) == (3 + 5 + 7, 'ab' + 'c')\n",
    "assert f(1, 2) is True\n",
    "assert abs(f(1.5, 2) - 2.0 / 3.0) < 1e-6, 'close'\n",
)
SHAPED = {
    "right": (
        "def f(a, b):\n    if a == 57:\n        return (15, 'abc')\n"
        "    return True if a == 1 else 2 / 3\n"
    ),
    "wrong": "def f(a, b):\n    return 0\n",
    "1 for True, a near miss": "def f(a, b):\n    return 1 if a == 1 else 0.6667\n",
    "text to subtract from": "def f(a, b):\n    return 'x'\n",
    "an object of its own": "class C:\n    pass\ndef f(a, b):\n    return C()\n",
    "nan": "def f(a, b):\n    return float('nan')\n",
    "raises": "def f(a, b):\n    raise ValueError(a)\n",
}


@pytest.mark.docker
@pytest.mark.parametrize("program", SHAPED.values(), ids=list(SHAPED))
def test_folded_literals_identity_and_tolerance_decide_as_the_judge_does(sandbox_pool, program):
    values = tuple(value_case(test, "f") for test in SHAPES)
    assert [case.compare for case in values] == ["==", "is", "close"]
    judged, valued = run_both(sandbox_pool, program, values=values, tests=SHAPES)
    assert outcomes(valued) == outcomes(judged)
    assert [t.passed for t in valued.tests] == [program == SHAPED["right"]] * 3


@pytest.mark.docker
def test_value_tests_run_no_judge_and_no_setup(sandbox_pool):
    """The setup would fail every test in a judge: with values it does not run."""
    judged, valued = run_both(sandbox_pool, ADD, setup="raise RuntimeError('setup ran')\n")
    assert valued.status is ExecStatus.COMPLETED and all(t.passed for t in valued.tests)
    assert not any(t.passed for t in judged.tests[:2]), judged
    assert "setup ran" in judged.tests[0].error


@pytest.mark.docker
def test_replies_past_a_mebibyte_go_to_the_judge(sandbox_pool):
    """A result too large to read in the supervisor: the judge runs the job again, so its
    setup's failure shows."""
    program = "def f(a, b):\n    return list(range(400_000))\n"
    _, valued = run_both(sandbox_pool, program, setup="raise RuntimeError('setup ran')\n")
    assert valued.tests and all("setup ran" in t.error for t in valued.tests), valued


def test_statements_that_are_plain_data():
    assert value_case("assert candidate(1, 'a') == [1, (2,)]\n", "candidate") == ValueCase(
        (1, "a"), [1, (2,)]
    )
    assert value_case("assert candidate(-1.5) == {1: None}, 'msg'", "candidate") == ValueCase(
        (-1.5,), {1: None}, "msg"
    )
    assert value_case("assert True, 'fine'", "candidate") == ValueCase(None, True, "fine")
    assert value_case("assert candidate(3 * 19, 'a' + 'b') == [0 ** 0, -2 ** 3]", "candidate") == (
        ValueCase((57, "ab"), [1, -8])
    )
    assert value_case("assert candidate(1) is None", "candidate") == ValueCase(
        (1,), None, compare="is"
    )
    assert value_case("assert abs(candidate(1.33) - 0.33) < 1e-6", "candidate") == ValueCase(
        (1.33,), 0.33, compare="close", tolerance=1e-6
    )
    for code in (
        "assert candidate(1) == True, 'got ' + str(candidate(1))",  # a message that calls
        "assert candidate([1, 2])",  # truth: the program answers for its own objects
        "assert not candidate(1)",
        "assert candidate(1) is 1",
        "assert candidate(1) is not None",
        "assert abs(candidate(1) - 1) <= 1e-6",
        "assert abs(candidate(1) - x) < 1e-6",
        "assert abs(other(1) - 1) < 1e-6",
        "assert candidate(2 ** 100_000) == 1",  # arithmetic folded only while it stays small
        "assert candidate(1 / 0) == 1",  # the test itself raises: the judge's to report
        "assert candidate('ab' * 3) == 1",
        "assert candidate(True + 1) == 2",
        "assert candidate(x + 1) == 2",
        "assert other(1) == 2",
        "assert candidate(x=1) == 2",
        "assert candidate(...) == 1",
        "import math\nassert candidate(1) == 1",
        "for x in range(3):\n    assert candidate(x) == x",
    ):
        assert value_case(code, "candidate") is None, code


def test_humaneval_problems_whose_tests_are_all_values():
    problems = load_problems("humaneval")
    valued = [p for p in problems.values() if values_of(p.tests) is not None]
    assert len(valued) == 146
    sample = problems["HumanEval/0"]
    assert values_of(sample.tests)[0] == ValueCase(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), True)


def test_mbpp_problems_whose_asserts_are_all_values():
    """One function called with literals: the value tests call it (a builtin the asserts call
    comes from the program only where the judge would take it from there)."""
    problems = load_problems("mbpp")
    judges = {task: asserts_judge(problem) for task, problem in problems.items()}
    assert sum(judge.values is not None for judge in judges.values()) == 966
    first = judges[next(iter(problems))]
    assert first.target == problems[next(iter(problems))].entry_point and first.values


def _replay(*replies: dict, tail: bytes = b"") -> list[dict]:
    case = {"message": None, "compare": "==", "tolerance": 0.0}
    job = {
        "program": "",
        "judge": {
            "tests": ["", ""],
            "test_names": ["first", "second"],
            "values": {
                "target": "f",
                "cases": [
                    {**case, "args": encode([1], None), "expected": encode(2, None)},
                    {
                        **case,
                        "args": encode([2], None),
                        "expected": encode(3, None),
                        "message": "m",
                    },
                ],
            },
        },
    }
    events: list[dict] = []
    data = b"".join(frame(reply) for reply in replies) + tail
    run_values(job, Replay(read_replies(data)), events.append)
    return events


def test_replies_are_read_back_in_order():
    ref = encode(object(), lambda obj: 1)
    events = _replay({"ok": None}, {"ok": ref}, {"ok": encode(2, None)}, {"ok": encode(4, None)})
    assert [(e.get("name"), e.get("passed"), e.get("error")) for e in events] == [
        ("first", True, None),
        ("second", False, "AssertionError: m"),
        (None, None, None),
    ]
    assert events[-1] == {"event": "done", "crashed": False}


def test_replies_that_end_or_break_fail_the_rest_as_a_crash():
    ref = encode(object(), lambda obj: 1)
    for tail in (b"", b"\x00\x00\x00\x09{broken"):
        events = _replay({"ok": None}, {"ok": ref}, {"ok": encode(2, None)}, tail=tail)
        second = events[1]
        assert events[0]["passed"] and not second["passed"] and second["candidate_error"]
        assert second["error"].startswith("CandidateCrashed"), second
        assert events[-1]["crashed"]


def test_a_question_off_the_script_has_no_answer_and_is_no_crash():
    ref = encode(object(), lambda obj: 1)
    replay = Replay(read_replies(frame({"ok": ref})))
    with pytest.raises(Exception, match="not asked for repr"):
        replay.exchange({"op": "repr", "ref": 1})
    assert replay.crashed is None and replay.exchange({"op": "get", "name": "f"}) == {"ok": ref}


def test_frames_in_reads_as_read_frame_does():
    frames = frames_in(frame([1]) + frame({"a": 2}))
    assert [next(frames), next(frames)] == [[1], {"a": 2}]
    with pytest.raises(PeerClosed):  # where the bytes end, as where a pipe closes
        next(frames)
    with pytest.raises(PeerClosed):
        next(frames_in(frame([1])[:-1]))
    with pytest.raises(ProtocolError, match="exceeds"):
        next(frames_in(frame("x" * 100), max_bytes=10))


def test_a_judge_spec_checks_its_values():
    spec = JudgeSpec(setup="", tests=("assert f(1) == 1",), target="f", values=(VALUES[0],))
    with pytest.raises(ValueError, match="one each"):
        dataclasses.replace(spec, tests=())
    with pytest.raises(ValueError, match="target"):
        dataclasses.replace(spec, target="")
    for case, why in (
        (lambda: ValueCase(None, True, compare="is"), "no args"),
        (lambda: ValueCase((1,), 5, compare="is"), "True, False or None"),
        (lambda: ValueCase((1,), 1.0, compare="close", tolerance=float("inf")), "finite"),
    ):
        with pytest.raises(ValueError, match=why):
            case()


def test_the_host_waits_for_a_value_job_to_run_twice():
    """Its replies may send it to the judge, with its time again: the host must not take the
    container for dead in the meantime."""
    config = PoolConfig(grace_s=10.0, wall_stretch=3.0)
    spec = JudgeSpec(setup="", tests=TESTS, target="f", values=VALUES)
    for values, runs in ((VALUES, 2), (None, 1)):
        job = Job(program=ADD, judge=dataclasses.replace(spec, values=values), limits=FAST)
        assert _host_deadline(_job_payload(job, config), config.grace_s) == runs * 2.0 * 3 + 10


# A program that writes the replies of the value tests' script on its own reply pipe (fd 4)
# before the real ones: the script's load and lookup, then `FORGED` as its call's result.
FORGED_REPLIES = (
    "import json, os, struct\n"
    "def _frame(message):\n"
    "    data = json.dumps(message).encode()\n"
    "    return struct.pack('>I', len(data)) + data\n"
    "os.write(4, _frame({'ok': None}) + _frame({'ok': [['ref', 0, 1]]}) + _frame({'ok': FORGED}))\n"
    "def f(a, b):\n"
    "    return 0\n"
)
COLLIDING = 2**61 - 1  # i * COLLIDING hashes to 0 for every int i
ONE_CALL = (ValueCase((1, 2), 3),)


def forged(tokens: str) -> str:
    return f"FORGED = {tokens}\n{FORGED_REPLIES}"


def supervisor_rss(pool) -> int:
    """The resident memory of the pool's one container's PID 1, the supervisor."""
    (container,) = pool._live
    container.container.reload()
    return psutil.Process(container.container.attrs["State"]["Pid"]).memory_info().rss


@pytest.mark.docker
def test_nothing_a_program_replies_stays_in_the_supervisor():
    """Every other answer names a namedtuple of 20,000 fields of its own (rebuilt in a decider
    that dies with the job), the others are 20,000 strings (rebuilt in the supervisor): it
    keeps none of them, so a later program that needs memory still has the container's."""
    program = (
        "import collections, os\n"
        "def f(a, b):\n"
        "    if os.getpid() % 2:\n"
        "        return [str(i) for i in range(20_000)]\n"
        "    return collections.namedtuple(f'T{os.getpid()}', [f'f{i}' for i in range(20_000)])"
        "(*range(20_000))\n"
    )
    needs_memory = "def f(a, b):\n    x = bytearray(300 << 20)\n    return a + b\n"
    limits = dataclasses.replace(FAST, memory_mb=1024, wall_time_s=10.0, cpu_time_s=10.0)
    with SandboxPool(PoolConfig(size=1)) as pool:

        def run(code: str):
            spec = JudgeSpec(setup="", tests=TESTS[:1], target="f", values=ONE_CALL)
            return pool.run(Job(program=code, judge=spec, limits=limits))

        assert run(needs_memory).status is ExecStatus.COMPLETED
        before = supervisor_rss(pool)
        results = [run(program) for _ in range(8)]
        grown = supervisor_rss(pool) - before
        assert [(r.status, r.tests[0].passed) for r in results] == [
            (ExecStatus.COMPLETED, False)
        ] * 8, results[0]
        assert grown < 8 << 20, f"the supervisor grew by {grown / 2**20:.1f} MB"
        honest = run(needs_memory)
    assert honest.status is ExecStatus.COMPLETED and honest.tests[0].passed, honest


@pytest.mark.docker
def test_a_reply_slow_to_rebuild_is_the_programs_timeout_not_a_sandbox_error(sandbox_pool):
    """42,000 ints that collide in a set take the decider minutes: it is stopped at the job's
    wall time, the supervisor answering meanwhile, and the container serves the next job."""
    program = forged(f"[['set', 42_000]] + [i * {COLLIDING} for i in range(42_000)]")
    started = time.monotonic()
    judged, valued = run_both(sandbox_pool, program, values=ONE_CALL, tests=TESTS[:1])
    took = time.monotonic() - started
    assert valued.status is ExecStatus.TIMEOUT, valued
    assert not any(t.passed for t in valued.tests)
    assert took < 60, took  # the decider's wall time (2 s, stretched on a busy machine) and more
    judged, valued = run_both(sandbox_pool, ADD)
    assert outcomes(valued) == outcomes(judged) and all(t.passed for t in valued.tests)


@pytest.mark.docker
@pytest.mark.parametrize(
    "tokens",
    [
        "[['set', 3], 1, 2, 3]",  # cheap: decided in the supervisor
        f"[['set', 2000]] + [i * {COLLIDING} for i in range(2000)]",  # past the hashed budget
        "[['Fraction', 2], 3, 1]",
        "[['namedtuple', 1, 'T', 'x'], 3]",
    ],
    ids=["cheap set", "colliding set", "fraction", "namedtuple"],
)
def test_forged_replies_decide_as_the_judge_does_wherever_they_are_decided(sandbox_pool, tokens):
    judged, valued = run_both(sandbox_pool, forged(tokens), values=ONE_CALL, tests=TESTS[:1])
    assert outcomes(valued) == outcomes(judged)
    assert valued.tests[0].passed is (tokens == "[['Fraction', 2], 3, 1]")


@pytest.mark.docker
def test_numbers_are_sent_as_their_own_value_not_as_their_methods_say(sandbox_pool):
    """Python's ``X(3) == 7`` is False for an int subclass whose ``__int__`` says 7."""
    program = (
        "class X(int):\n    def __int__(self):\n        return 7\n"
        "class Y(float):\n    def __float__(self):\n        return 7.0\n"
        "def f(a, b):\n    return X(3) if a == 1 else Y(3.0)\n"
    )
    tests = ("assert f(1, 2) == 3\n", "assert f(2, 2) == 3.0\n", "assert f(1, 2) == 7\n")
    values = tuple(value_case(test, "f") for test in tests)
    judged, valued = run_both(sandbox_pool, program, values=values, tests=tests)
    assert outcomes(valued) == outcomes(judged)
    assert [t.passed for t in valued.tests] == [True, True, False]


@pytest.mark.docker
def test_a_value_job_sent_to_the_judge_runs_again_with_its_own_time(sandbox_pool):
    """Replies past a mebibyte after 1.5 s of a 2.5 s job: the judge's run has 2.5 s too."""
    program = "import time\ndef f(a, b):\n    time.sleep(1.5)\n    return 'x' * (2 << 20)\n"
    limits = dataclasses.replace(FAST, wall_time_s=4.0, cpu_time_s=4.0, job_time_s=2.5)
    spec = JudgeSpec(
        setup="f = __remote__('f')\n",
        tests=("assert f(1, 2) == 'x' * (2 << 20)\n",),
        target="f",
        values=(ValueCase((1, 2), "x" * (2 << 20)),),
    )
    result = sandbox_pool.run(Job(program=program, judge=spec, limits=limits))
    assert result.status is ExecStatus.COMPLETED and result.tests[0].passed, result


def test_which_replies_the_supervisor_decides_itself():
    def cheap(*oks, raised=None) -> bool:
        replies = [{"ok": None}, {"ok": encode(object(), lambda obj: 1)}]
        replies += [{"ok": ok} for ok in oks]
        if raised is not None:
            replies.append({"raise": raised})
        return cheap_to_decide(read_replies(b"".join(frame(r) for r in replies)))

    assert cheap(encode([1, "a", 2.5, None], None), encode(10**5000, None))
    assert cheap(encode({"a": [1, (2, 3)], "b": {4, 5}}, None))
    assert cheap(encode(list(range(100_000)), None))  # long, but no hashing
    assert cheap(raised={"type": "ValueError", "bases": ["ValueError", "Exception"]})
    assert not cheap(raised={"type": "E", "bases": ["KeyError"]})  # a class of its own
    assert not cheap(encode(set(range(HASHED_TOKENS + 1)), None))
    assert not cheap(*[encode(set(range(HASHED_TOKENS // 4)), None)] * 5)  # a budget per job
    assert not cheap(encode(collections.namedtuple("T", "x")(1), None))
    assert not cheap(encode([fractions.Fraction(1, 3)], None))
    assert not cheap(encode(decimal.Decimal("1.5"), None))
    assert not cheap(encode({"k": collections.Counter("ab")}, None))


# Setups that change what `abs` means to the tests after them, each in a way of its own.
REBIND_ABS = {
    "an import": "from math import fabs as abs\n",
    "a module import": "import abs\n",
    "a tuple assignment": "abs, other = (lambda x: 0), 1\n",
    "a starred assignment": "*abs, = [1]\n",
    "a nested definition": "if True:\n    def abs(x):\n        return 0\n",
    "a global in a function": "def patch():\n    global abs\n    abs = len\npatch()\n",
    "a walrus": "[(abs := len) for _ in range(1)]\n",
    "a loop target": "for abs in [len]:\n    pass\n",
    "a with target": "import contextlib\nwith contextlib.nullcontext(len) as abs:\n    pass\n",
    "a star import": "from os.path import *\n",
    "builtins": "import builtins\nbuiltins.abs = lambda x: 0\n",
    "globals()": "globals()['abs'] = lambda x: 0\n",
    "exec": "exec('abs = len')\n",
    "sys.modules": "import sys\nsys.modules['builtins'].abs = len\n",
    "a class": "class abs:\n    pass\n",
    "a function's globals": "def _h():\n    pass\n_h.__globals__['abs'] = lambda x: 1.0\n",
    "a frame's globals": "import inspect as _i\n_i.currentframe().f_globals['abs'] = len\n",
    "a frame reached without inspect": "try:\n    1 / 0\nexcept Exception as e:\n"
    "    e.__traceback__.tb_frame.f_globals['abs'] = len\n",
    "getattr": "def _h():\n    pass\ngetattr(_h, '__glob' + 'als__')['abs'] = len\n",
    "the collector": "import gc as _g\n_g.get_referrers(len)[0]['abs'] = len\n",
}


def close_problem(setup: str) -> Problem:
    return Problem(
        task_id="close",
        prompt="def f(x):\n",
        prompt_is_code=True,
        entry_point="f",
        test=f"{setup}\n\ndef check(candidate):\n    assert abs(candidate(1.0) - 0.5) < 1e-6\n",
    )


@pytest.mark.parametrize("setup", REBIND_ABS.values(), ids=list(REBIND_ABS))
def test_a_setup_that_may_rebind_abs_keeps_its_judge(setup):
    assert check_judge(close_problem(setup)).values is None


def test_code_that_does_not_parse_may_rebind_anything():
    assert may_rebind("def (:\n", {"abs"}) and not may_rebind("x = abs(1)\n", {"abs"})


def test_a_setup_that_only_uses_abs_keeps_its_value_tests():
    setup = "import math\nTOLERANCE = abs(-1e-6)\ndef helper(y):\n    return abs(y)\n"
    assert check_judge(close_problem(setup)).values == (
        ValueCase((1.0,), 0.5, compare="close", tolerance=1e-6),
    )


def test_asserts_whose_imports_rebind_their_function_keep_their_judge():
    problem = Problem(
        task_id="gcd",
        prompt="Write gcd.",
        test_list=["assert gcd(4, 6) == 2"],
        test_imports=["from math import gcd"],
    )
    assert asserts_judge(problem).values is None
    assert asserts_judge(problem.model_copy(update={"test_imports": ["import math"]})).values


@pytest.mark.docker
@pytest.mark.parametrize(
    "setup",
    ["abs = lambda x: 1.0\n", "def _h():\n    pass\n_h.__globals__['abs'] = lambda x: 1.0\n"],
    ids=["by name", "through a function's globals"],
)
def test_a_setup_that_rebinds_abs_decides_as_its_judge_does(sandbox_pool, setup):
    """The tests compare with the setup's `abs`, which a program cannot satisfy."""
    problem = close_problem(setup)
    job = Job(program="def f(x):\n    return 0.5\n", judge=check_judge(problem), limits=FAST)
    result = sandbox_pool.run(job)
    assert result.status is ExecStatus.COMPLETED and not result.tests[0].passed, result
