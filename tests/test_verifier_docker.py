"""The verifier on the real Docker sandbox: HumanEval and MBPP judges, tampering, limits, CLI."""

from __future__ import annotations

import json

import pytest

from codepost.sandbox import Limits
from codepost.verifiers import (
    Problem,
    RewardConfig,
    VerdictStatus,
    Verifier,
    load_problems,
    verify_command,
)

pytestmark = pytest.mark.docker

MBPP = "mbpp"  # the copy shipped in codepost/verifiers/data
SANITIZED_MBPP = "mbpp-sanitized"
LIMITS = Limits(wall_time_s=5.0, cpu_time_s=5.0, memory_mb=256)


@pytest.fixture(scope="module")
def humaneval() -> dict[str, Problem]:
    return load_problems()


@pytest.fixture
def verifier(sandbox_pool) -> Verifier:
    return Verifier(sandbox_pool, limits=LIMITS)


def statuses(verifier, problems, samples) -> list[str]:
    return [verdict.status.value for verdict in verifier.verify(problems, samples)]


def test_humaneval_canonical_and_wrong_solutions(verifier, humaneval):
    task_ids = ["HumanEval/0", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50"]
    good = [{"task_id": t, "completion": humaneval[t].canonical_solution} for t in task_ids]
    wrong = [{"task_id": t, "completion": "    return None\n"} for t in task_ids]
    verdicts = verifier.verify(humaneval, good + wrong)
    assert [v.status.value for v in verdicts] == ["passed"] * 5 + ["failed"] * 5
    assert all(v.result == "passed" and v.reward == 1.0 for v in verdicts[:5])
    assert verdicts[5].result == "failed: AssertionError"
    assert verdicts[0].tests[0].name.startswith("assert candidate([1.0, 2.0, 3.9")


def test_humaneval_tests_use_trusted_helpers(verifier, humaneval):
    samples = [
        # redefines poly so that 0.0 is "a root"
        {
            "task_id": "HumanEval/32",
            "completion": "    return 0.0\n\ndef poly(xs, x):\n    return 0\n",
        },
        # identity decode with an identity encode
        {
            "task_id": "HumanEval/38",
            "completion": "    return s\n\ndef encode_cyclic(s):\n    return s\n",
        },
        # a chat answer relying on the prompt's encode_cyclic
        {
            "task_id": "HumanEval/38",
            "completion": "```python\ndef decode_cyclic(s):\n    return encode_cyclic(encode_cyclic(s))\n```",
        },
    ]
    assert statuses(verifier, humaneval, samples) == ["failed", "failed", "passed"]


def test_tampering_does_not_pass(verifier, humaneval):
    always_equal = (
        "    class Equal:\n        def __eq__(self, other):\n            return True\n"
        "    return Equal()\n"
    )
    patch_builtins = "    return None\n\nimport builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
    exit_early = "    import os\n    os._exit(0)\n"
    samples = [
        {"task_id": "HumanEval/0", "completion": completion}
        for completion in (always_equal, patch_builtins, exit_early)
    ]
    verdicts = verifier.verify(humaneval, samples)
    assert [v.passed for v in verdicts] == [False, False, False]
    assert verdicts[0].status is VerdictStatus.FAILED


def test_load_errors_limits_and_candidate_exceptions(verifier, humaneval):
    samples = [
        {"task_id": "HumanEval/0", "completion": "    return (\n"},
        {"task_id": "HumanEval/0", "completion": "    return 1\nraise ValueError('at load')\n"},
        {"task_id": "HumanEval/0", "completion": "    raise KeyError('in a test')\n"},
        {"task_id": "HumanEval/0", "completion": "    while True:\n        pass\n"},
    ]
    verdicts = verifier.verify(humaneval, samples)
    assert [v.status.value for v in verdicts] == [
        "syntax_error",
        "runtime_error",
        "runtime_error",
        "timeout",
    ]
    assert verdicts[0].result.startswith("failed: SyntaxError")
    assert verdicts[1].result == "failed: ValueError: at load"
    assert verdicts[3].result == "timed out"


def test_mbpp_judges(verifier):
    mbpp = load_problems(MBPP)
    sanitized = load_problems(SANITIZED_MBPP)
    samples = [
        {"task_id": t, "completion": mbpp[t].canonical_solution} for t in ("601", "367", "126")
    ]
    verdicts = verifier.verify(mbpp, samples)
    assert [v.status.value for v in verdicts] == ["passed"] * 3, [v.result for v in verdicts]
    cheat = "def similar_elements(a, b):\n    return None\n\ndef set(x=()):\n    return 1\n"
    samples = [
        {"task_id": "596", "completion": sanitized["596"].canonical_solution},
        {"task_id": "798", "completion": sanitized["798"].canonical_solution},
        {"task_id": "2", "completion": cheat},
    ]
    assert statuses(verifier, sanitized, samples) == ["passed", "passed", "failed"]


def test_io_problems(verifier):
    problem = Problem(
        task_id="sum",
        prompt="Read two integers, print their sum.",
        io=[{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}],
    )
    samples = [
        {"task_id": "sum", "completion": "a, b = map(int, input().split())\nprint(a + b, ' ')\n"},
        {"task_id": "sum", "completion": "a, b = map(int, input().split())\nprint(a * b)\n"},
        {"task_id": "sum", "completion": "print(int(input()))\n"},
    ]
    verdicts = verifier.verify({"sum": problem}, samples)
    assert [v.status.value for v in verdicts] == ["passed", "failed", "runtime_error"]
    assert "ValueError" in verdicts[2].stderr


def test_io_cases_with_large_expected_outputs_all_pass(verifier):
    """The output budget grows with what the cases expect (issue 17, class 1)."""
    cases = [{"input": f"{n}\n", "output": f"{n}\n" * 100_000} for n in (1, 2, 3)]
    problem = Problem(task_id="repeat", prompt="Print n 100,000 times.", io=cases)
    program = "import sys\nn = input()\nsys.stdout.write(f'{n}\\n' * 100_000)\n"
    limits = Limits(wall_time_s=5.0, cpu_time_s=5.0, output_bytes=300_000)
    (verdict,) = Verifier(verifier.executor, limits=limits).verify(
        {"repeat": problem}, [{"task_id": "repeat", "completion": program}]
    )
    assert verdict.passed, verdict.result


@pytest.mark.parametrize(("test_reward", "cases_run"), [("binary", 1), ("pass_fraction", 3)])
def test_io_stops_at_the_first_failed_case_for_a_binary_reward(
    sandbox_pool, test_reward, cases_run
):
    """Every case ran to its time limit even after one had failed (issue 17, class 4)."""
    problem = Problem(
        task_id="slow",
        prompt="Print n.",
        io=[{"input": f"{n}\n", "output": f"{n}\n"} for n in (1, 2, 3)],
    )
    limits = Limits(wall_time_s=1.0, cpu_time_s=1.0, memory_mb=256)
    config = RewardConfig(test_reward=test_reward)
    verifier = Verifier(sandbox_pool, limits=limits, reward_config=config)
    sample = {"task_id": "slow", "completion": "import time\ntime.sleep(30)\n"}
    (verdict,) = verifier.verify({"slow": problem}, [sample])
    assert verdict.status is VerdictStatus.TIMEOUT and len(verdict.tests) == cases_run


def test_cli_end_to_end(tmp_path, humaneval, capsys):
    samples = tmp_path / "samples.jsonl"
    rows = [
        {"task_id": "HumanEval/0", "completion": humaneval["HumanEval/0"].canonical_solution},
        {"task_id": "HumanEval/0", "completion": "    return True\n"},
    ]
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert verify_command.main(["verify", str(samples), "--workers", "1", "--timeout", "5"]) == 0
    written = [json.loads(line) for line in (tmp_path / "samples.jsonl_results.jsonl").open()]
    assert [row["passed"] for row in written] == [True, False]
    assert "pass@1" in capsys.readouterr().out
