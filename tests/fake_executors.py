"""Fake executors for fast verifier tests: the sandbox's call and io modes in this process.

``InProcessExecutor`` isolates nothing: it only runs the trusted test code written in tests.
"""

from __future__ import annotations

import contextlib
import io
import sys
import traceback
import types
from concurrent.futures import Future

from codepost.sandbox import CaseOutcome, ExecStatus, ExecutionResult, Job
from codepost.sandbox import TestOutcome as Outcome  # not collected as a test class


class InProcessExecutor:
    """Runs jobs like the sandbox does (judge namespace, ``__remote__``), with NO isolation."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        self.jobs.append(job)
        future: Future[ExecutionResult] = Future()
        future.set_result(self.run(job))
        return future

    def run(self, job: Job) -> ExecutionResult:
        try:
            code = compile(job.program, "<candidate>", "exec")
        except SyntaxError as exc:
            message = f"SyntaxError: {exc.msg}"
            return ExecutionResult(ExecStatus.SYNTAX_ERROR, error=message, stderr=message)
        if job.judge is None:
            cases = tuple(self.run_case(code, stdin) for stdin in job.stdin_cases or ())
            return ExecutionResult(ExecStatus.COMPLETED, cases=cases)
        namespace: dict = {"__name__": "__candidate__"}
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            try:
                exec(code, namespace)
            except Exception:
                message = traceback.format_exc()
                return ExecutionResult(ExecStatus.RUNTIME_ERROR, error=message, stderr=message)

        def remote(name: str):
            if name not in namespace:
                raise NameError(f"the program does not define {name!r}")
            return namespace[name]

        def remote_names() -> list[str]:
            return [
                name
                for name, value in namespace.items()
                if not name.startswith("_") and not isinstance(value, types.ModuleType)
            ]

        judge = {"__name__": "__judge__", "__remote__": remote, "__remote_names__": remote_names}
        setup_failure = None
        try:
            exec(job.judge.setup, judge)
        except Exception as exc:
            setup_failure = exc
        names = job.judge.test_names or [f"test_{i}" for i in range(len(job.judge.tests))]
        outcomes = []
        for name, source in zip(names, job.judge.tests, strict=True):
            failure = setup_failure
            if failure is None:
                try:
                    with contextlib.redirect_stdout(stdout):
                        exec(source, judge)
                except Exception as exc:
                    failure = exc
            outcomes.append(
                Outcome(
                    name=name,
                    passed=failure is None,
                    error=None if failure is None else _describe(failure),
                    candidate_error=failure is not None and _raised_in_candidate(failure),
                )
            )
        return ExecutionResult(
            ExecStatus.COMPLETED, tests=tuple(outcomes), stdout=stdout.getvalue()
        )

    @staticmethod
    def run_case(code: types.CodeType, stdin: str) -> CaseOutcome:
        out, err = io.StringIO(), io.StringIO()
        status, exit_code = ExecStatus.COMPLETED, 0
        saved_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(code, {"__name__": "__main__"})
        except SystemExit as exc:
            exit_code = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            err.write(traceback.format_exc())
            exit_code = 1
        finally:
            sys.stdin = saved_stdin
        if exit_code:
            status = ExecStatus.RUNTIME_ERROR
        return CaseOutcome(status, out.getvalue(), err.getvalue(), exit_code, 0.0)


def _describe(exc: BaseException) -> str:  # as the sandbox's judge describes failures
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _raised_in_candidate(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any(frame.filename == "<candidate>" for frame in frames)


class CannedExecutor:
    """Answers every job with the same result (sandbox-level statuses)."""

    def __init__(self, result: ExecutionResult) -> None:
        self.result = result

    def submit(self, job: Job) -> Future[ExecutionResult]:
        future: Future[ExecutionResult] = Future()
        future.set_result(self.result)
        return future
