"""codepost's own records, and HumanEval's and MBPP's as they come: what no other schema claims.

Flat fields name the form (``test`` + ``entry_point``: HumanEval; ``test_list``: MBPP; ``io``,
``call``, ``test_file``: the others), or ``tests`` holds them with their ``form``, as a
problem's ``model_dump()`` writes it.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Mapping
from typing import Any

from ..forms import forms
from ..python_ast import parse_problem_code
from . import Schema, first, register

TASK_ID_KEYS = ("task_id", "problem_id", "name")
PROMPT_KEYS = ("prompt", "text", "question", "description")
PROBLEM_KEYS = (
    "entry_point",
    "prompt_is_code",
    "language",
    "references",
    "time_limit_s",
    "memory_limit_mb",
    "tests",
)


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "task_id": first(record, TASK_ID_KEYS),
        "prompt": first(record, PROMPT_KEYS),
        **{key: record[key] for key in PROBLEM_KEYS if key in record},
    }
    if "tests" not in record:  # the fields of the forms the record has (one, or an error)
        for form in forms().values():
            if form.marker in record:
                own = set(form.tests_model.model_fields) - {"form"}
                out.update({key: record[key] for key in own if key in record})
    if "test_list" in record and "entry_point" not in record:
        out["entry_point"] = first_called_name(record["test_list"])
    out.setdefault("prompt_is_code", "test" in record)  # HumanEval's prompt is code
    out["canonical_solution"] = canonical_solution(record)
    return out


def canonical_solution(record: Mapping[str, Any]) -> Any:
    for key in ("canonical_solution", "code"):  # HumanEval, MBPP
        if key in record:
            return record[key]
    return None


def first_called_name(test_list: Any) -> str | None:
    """The function MBPP asserts are about: the first call of a non-builtin name
    (``assert set(f(x)) == ...`` -> ``f``). Never a builtin: a program that defines ``abs``
    must not become what ``abs(f(x) - y) < eps`` measures with (the asserts judge decides
    which builtins the program provides)."""
    if not isinstance(test_list, list | tuple):
        return None
    for line in test_list:
        try:
            tree = parse_problem_code(str(line), "test_list")
        except SyntaxError:
            return None  # the validator reports it
        for node in ast.walk(tree):
            called = (
                node.func.id
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                else None
            )
            if called and not hasattr(builtins, called):
                return called
    return None


register(
    Schema(
        name="codepost",
        matches=lambda record: False,  # the fallback: every record no other schema claims
        fields=fields,
        follows="codepost's own; HumanEval (openai_humaneval); MBPP (full and sanitized)",
    )
)
