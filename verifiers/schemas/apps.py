"""APPS and TACO: ``question``, ``solutions`` and ``input_output`` (JSON strings), ``starter_code``.

``input_output`` is ``{"inputs": [...], "outputs": [...], "fn_name"?}``: with ``fn_name`` the
problem is call-based (each input the argument list, compared as APPS' ``testing_util``
compares), otherwise stdin/stdout (compared as rllm compares TACO and APPS, with
LiveCodeBench's line rule; the cases that are the statement's examples are what a model may
see between turns, else the first). APPS has ``problem_id``; TACO has no id column (its
``name`` is often null), so a TACO record without one is known by its row number. TACO's
``time_limit`` ("1 second") and ``memory_limit`` ("256 megabytes") are the problem's limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import (
    ProblemFormatError,
    Schema,
    call_tests,
    first,
    json_field,
    megabytes,
    register,
    seconds,
    stdin_tests,
    zip_cases,
)


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    pairs = json_field(record, "input_output")
    if not isinstance(pairs, Mapping) or not {"inputs", "outputs"} <= pairs.keys():
        raise ProblemFormatError("field 'input_output': needs 'inputs' and 'outputs' lists")
    cases = zip_cases("input_output", pairs["inputs"], pairs["outputs"])
    starter = str(record.get("starter_code") or "")
    out: dict[str, Any] = {
        "task_id": next(
            (record[key] for key in ("problem_id", "task_id", "name") if key in record), position
        ),
        "prompt": first(record, ("question", "prompt")),
        "canonical_solution": _first_solution(record),
        "time_limit_s": seconds(record.get("time_limit")),
        "memory_limit_mb": megabytes(record.get("memory_limit")),
    }
    fn_name = pairs.get("fn_name")
    if fn_name:
        arguments = [(i if isinstance(i, list) else [i], o) for i, o in cases]
        return {**out, **call_tests(fn_name, arguments, "apps", starter)}
    # APPS joins inputs and outputs given as lists of lines
    texts = [(_text(i), _text(o)) for i, o in cases]
    shown = [case for case in texts if in_statement(out["prompt"], *case)]
    return {**out, **stdin_tests(texts, shown or None)}


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def in_statement(statement: Any, given: str, expected: str) -> bool:
    """Whether a case is one of the statement's examples: its input's lines appear as whole
    lines of the statement, its output's lines after them (APPS' "Input ... Output" blocks),
    each stripped, neither empty. Whole lines, so an input ``1`` is not found in ``1 <= n``."""
    lines = [line.strip() for line in str(statement).splitlines()]
    at = _lines_at(lines, given, 0)
    return at is not None and _lines_at(lines, expected, at) is not None


def _lines_at(lines: list[str], text: str, start: int) -> int | None:
    """Where the lines of ``text`` next appear whole in ``lines`` from ``start``: the index
    after them; None when they do not, or ``text`` is blank."""
    wanted = [line.strip() for line in text.strip().splitlines()]
    if not wanted:
        return None
    for at in range(start, len(lines) - len(wanted) + 1):
        if lines[at : at + len(wanted)] == wanted:
            return at + len(wanted)
    return None


def _first_solution(record: Mapping[str, Any]) -> str | None:
    if "solutions" not in record:
        return None
    try:
        solutions = json_field(record, "solutions")
    except ProblemFormatError:
        return None
    return solutions[0] if isinstance(solutions, list) and solutions else None


register(
    Schema(
        name="apps",
        matches=lambda record: "input_output" in record,
        fields=fields,
        follows="codeparrot/apps, BAAI/TACO (and TACO-verified)",
    )
)
