"""``POST /verify``: ``codepost verify``'s samples and options in a request, its problems by name or
inline, bounded before any job is built."""

from __future__ import annotations

import functools
import json
from typing import Any

from fastapi import HTTPException
from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
)

from ..bounds import Budget, ReadingBounds, reading_within
from ..options import VerifyOptions
from ..problems import (
    HUMANEVAL,
    NAMED_PROBLEMS,
    Problem,
    ProblemFormatError,
    cap_tests,
    load_problems,
    posed_in,
    problems_from_records,
)
from .config import PoolServerConfig, ServerConfig

MAX_ITEMS = 1 << 16  # samples, or inline problems, or their test cases, in one /verify request
MAX_DEPTH = 32  # lists and objects nested in one sample or inline problem
# What packed tests (LiveCodeBench's private tests) may unpack to: one field, 4x the largest
# problem; all of a request's together, 8x its problems' bytes. zlib and base64 pack test data
# 1.5-4.5x (large numbers 1.5x, a grid of '.' and '#' 4.5x), so honest tests fit both.
UNPACKED_PER_PROBLEM_BYTE = 4
UNPACKED_PER_REQUEST_BYTE = 8


class VerifyRequest(VerifyOptions):
    """``codepost verify`` in a request: its samples, problems and options."""

    samples: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)
    problems: str | list[dict[str, Any]] = Field(
        HUMANEVAL,
        max_length=MAX_ITEMS,
        description=f"one of {', '.join(NAMED_PROBLEMS)}, or problem records inline",
    )

    @field_validator("samples", "problems")
    @classmethod
    def _shallow(cls, items: str | list[dict[str, Any]], info: ValidationInfo) -> Any:
        if isinstance(items, list):
            for index, item in enumerate(items):
                if nesting_depth(item) > MAX_DEPTH:
                    raise ValueError(
                        f"{info.field_name}[{index}] is nested over {MAX_DEPTH} levels deep"
                    )
        return items


def nesting_depth(value: Any) -> int:
    """How deep lists and objects nest in ``value``, parsed JSON (iteratively: a sample nested
    900 deep passed the parser, then broke the answer's serialiser after every job had run)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


@functools.cache
def named_problems(name: str) -> dict[str, Problem]:
    return load_problems(name)


def request_problems(request: VerifyRequest, config: ServerConfig) -> dict[str, Problem]:
    """The request's problems, at most ``max_tests`` tests each and within the server's time
    and memory caps. Run off the event loop: inline test code is parsed here."""
    try:
        problems = posed_in(named_or_inline(request.problems, config), request.language)
    except ProblemFormatError as exc:
        raise HTTPException(422, f"language: {exc}") from None
    problems = cap_tests(problems, request.max_tests)
    if isinstance(request.problems, list):
        check_test_counts(problems, config, "send fewer, or set max_tests")
    return within_caps(problems, config)


def check_test_counts(problems: dict[str, Problem], config: PoolServerConfig, advice: str) -> None:
    """413 naming an inline problem with more tests than the server's ``max_problem_tests``."""
    for task_id, problem in problems.items():
        count = problem.tests.count()
        if count > config.max_problem_tests:
            raise HTTPException(
                413,
                f"problem {task_id!r} has {count} tests, over the server's max_problem_tests "
                f"{config.max_problem_tests}: {advice}",
            )


def named_or_inline(
    problems: str | list[dict[str, Any]], config: PoolServerConfig
) -> dict[str, Problem]:
    """Problems by name (the sets shipped with codepost) or inline, each inline record at most
    ``max_problem_bytes``; never a path or a hub id, so no request makes the server read its
    disk or the network."""
    if isinstance(problems, str):
        if problems not in NAMED_PROBLEMS:
            raise HTTPException(
                422,
                f"unknown problem set {problems!r}: named sets are {', '.join(NAMED_PROBLEMS)};"
                " send other problems inline",
            )
        return named_problems(problems)
    total = 0
    for index, record in enumerate(problems):
        size = len(json.dumps(record))
        if size > config.max_problem_bytes:
            raise HTTPException(
                413,
                f"problems[{index}] is {size} bytes of JSON, over the server's "
                f"max_problem_bytes {config.max_problem_bytes}",
            )
        total += size
    bounds = ReadingBounds(
        unpacked_bytes=UNPACKED_PER_PROBLEM_BYTE * config.max_problem_bytes,
        code_chars=config.max_problem_code_chars,
        budget=Budget(
            unpacked_bytes=UNPACKED_PER_REQUEST_BYTE * total,
            code_chars=config.max_request_code_chars,
            tests=MAX_ITEMS,
        ),
    )
    try:
        with reading_within(bounds):
            return problems_from_records((f"problems[{i}]", r) for i, r in enumerate(problems))
    except ProblemFormatError as exc:
        raise HTTPException(422, f"problems: {exc}") from None


def within_caps(problems: dict[str, Problem], config: PoolServerConfig) -> dict[str, Problem]:
    """The problems with their own time and memory limits (a request's inline records may
    carry any) no higher than the server's caps."""
    return {
        task_id: problem.model_copy(
            update={
                "time_limit_s": problem.time_limit_s
                and min(problem.time_limit_s, config.max_timeout_s),
                "memory_limit_mb": problem.memory_limit_mb
                and min(problem.memory_limit_mb, config.max_memory_mb),
            }
        )
        for task_id, problem in problems.items()
    }
