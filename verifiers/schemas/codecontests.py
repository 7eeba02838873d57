"""CodeContests: ``name``, ``description``, ``public_tests`` / ``private_tests`` /
``generated_tests`` (``{"input": [...], "output": [...]}``: all of them score, the public
ones are what a model may see between turns), ``solutions`` (``{"language":
[...], "solution": [...]}``, language 2 is C++, 3 is Python 3), ``time_limit`` (``{"seconds",
"nanos"}``) and ``memory_limit_bytes``: the problem's limits. Outputs are compared as rllm
compares CodeContests (LiveCodeBench's line rule).

A problem is posed in Python, its first Python 3 solution the reference; its first C++ solution
is the reference of its C++ variant (``Problem.in_language("cpp")``, ``--language cpp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import ProblemFormatError, Schema, first, register, stdin_tests, zip_cases

TEST_KEYS = ("public_tests", "private_tests", "generated_tests")
PUBLIC = TEST_KEYS[0]  # the examples of the statement: what a model may see
CPP, PYTHON3 = 2, 3  # CodeContests' Language enum


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    cases: dict[str, list[tuple[Any, Any]]] = {}
    for key in TEST_KEYS:
        tests = record.get(key) or {"input": [], "output": []}
        if not isinstance(tests, Mapping):
            raise ProblemFormatError(f"field {key!r}: needs 'input' and 'output' lists")
        cases[key] = zip_cases(key, tests.get("input"), tests.get("output"))
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
        "canonical_solution": _first_solution(record.get("solutions"), PYTHON3),
        "references": _references(record.get("solutions")),
        "time_limit_s": seconds or None,
        "memory_limit_mb": int(memory) >> 20 if memory else None,
        **stdin_tests(
            [case for key in TEST_KEYS for case in cases[key]],
            public=cases[PUBLIC] if PUBLIC in record else None,
        ),
    }


def _first_solution(solutions: Any, language: int) -> str | None:
    if not isinstance(solutions, Mapping):
        return None
    pairs = zip(solutions.get("language") or [], solutions.get("solution") or [], strict=False)
    return next((code for number, code in pairs if number == language), None)


def _references(solutions: Any) -> dict[str, str]:
    cpp = _first_solution(solutions, CPP)
    return {"cpp": cpp} if cpp is not None else {}


register(
    Schema(
        name="codecontests",
        matches=lambda record: any(key in record for key in TEST_KEYS),
        fields=fields,
        follows="deepmind/code_contests",
    )
)
