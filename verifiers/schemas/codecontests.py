"""CodeContests: ``name``, ``description``, ``public_tests`` / ``private_tests`` /
``generated_tests`` (``{"input": [...], "output": [...]}``), ``solutions`` (``{"language":
[...], "solution": [...]}``, language 3 is Python 3), ``time_limit`` (``{"seconds", "nanos"}``)
and ``memory_limit_bytes``: the problem's limits. Outputs are compared as rllm compares
CodeContests (LiveCodeBench's line rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import ProblemFormatError, Schema, first, register, stdin_tests, zip_cases

TEST_KEYS = ("public_tests", "private_tests", "generated_tests")
PYTHON3 = 3  # CodeContests' Language enum


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    cases: list[tuple[Any, Any]] = []
    for key in TEST_KEYS:
        tests = record.get(key) or {"input": [], "output": []}
        if not isinstance(tests, Mapping):
            raise ProblemFormatError(f"field {key!r}: needs 'input' and 'output' lists")
        cases += zip_cases(key, tests.get("input"), tests.get("output"))
    limit = record.get("time_limit")
    seconds = (
        limit.get("seconds", 0) + limit.get("nanos", 0) / 1e9
        if isinstance(limit, Mapping)
        else None
    )
    memory = record.get("memory_limit_bytes")
    return {
        "task_id": first(record, ("name", "task_id")),
        "prompt": first(record, ("description", "prompt")),
        "canonical_solution": _python3_solution(record.get("solutions")),
        "time_limit_s": seconds or None,
        "memory_limit_mb": int(memory) >> 20 if memory else None,
        **stdin_tests(cases),
    }


def _python3_solution(solutions: Any) -> str | None:
    if not isinstance(solutions, Mapping):
        return None
    pairs = zip(solutions.get("language") or [], solutions.get("solution") or [], strict=False)
    return next((code for language, code in pairs if language == PYTHON3), None)


register(
    Schema(
        name="codecontests",
        matches=lambda record: any(key in record for key in TEST_KEYS),
        fields=fields,
        follows="deepmind/code_contests",
    )
)
