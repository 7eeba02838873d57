"""Value tests (``JudgeSpec.values``): tests that are plain data are decided without a judge
process, with the outcomes the judge gives for their code. The extraction and the replay run
here (fast); the comparison with the judge runs in the Docker sandbox."""

from __future__ import annotations

import dataclasses

import pytest

from codepost.sandbox import ExecStatus, Job, JudgeSpec, Limits, PoolConfig, ValueCase
from codepost.sandbox.pool import _host_deadline, _job_payload
from codepost.sandbox.runner.codec import PeerClosed, ProtocolError, encode, frame, frames_in
from codepost.sandbox.runner.judge import Replay, run_values
from codepost.verifiers.forms.asserts import asserts_judge
from codepost.verifiers.forms.check import values_of
from codepost.verifiers.judges import value_case
from codepost.verifiers.problems import load_problems

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
    run_values(job, Replay(frames_in(data)), events.append)
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
    replay = Replay(frames_in(frame({"ok": ref})))
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
