"""SYNTHETIC-1's coding problems (PrimeIntellect/verifiable-coding-problems): ``problem_id``,
``prompt``, ``gold_standard_solution`` (a fenced answer), ``verification_info`` (a JSON string:
``language`` and ``test_cases`` of ``{fn_name, input, output, type}``, the type
``stdin_stdout`` or ``function_call``), ``metadata`` (a JSON string). ``language`` (``python``,
``cpp``...) is the language of the problem and of its gold solution's fenced block.

rllm's ``primeintellect_check_correctness`` runs them through TACO's harness: function calls
compared as APPS compares them, stdin as rllm compares TACO's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..extraction import extract_code
from ..languages import canonical_language
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
)


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    info = json_field(record, "verification_info")
    cases = info.get("test_cases") if isinstance(info, Mapping) else None
    if not isinstance(cases, list) or not cases or not all(isinstance(c, Mapping) for c in cases):
        raise ProblemFormatError("field 'verification_info': needs a list of test_cases")
    metadata = json_field(record, "metadata") if record.get("metadata") else {}
    metadata = metadata if isinstance(metadata, Mapping) else {}
    gold = record.get("gold_standard_solution")
    language = canonical_language(str(info.get("language") or "python"))
    out: dict[str, Any] = {
        "task_id": first(record, ("problem_id", "task_id")),
        "prompt": first(record, ("prompt",)),
        "language": language,
        "canonical_solution": extract_code(gold, None, language) if isinstance(gold, str) else None,
        "time_limit_s": seconds(metadata.get("time_limit")),
        "memory_limit_mb": megabytes(metadata.get("memory_limit")),
    }
    fn_name = next((c.get("fn_name") for c in cases if c.get("fn_name")), None)
    if fn_name or any(c.get("type") == "function_call" for c in cases):
        if not fn_name:
            raise ProblemFormatError("field 'verification_info': function calls need a fn_name")
        calls = [(_arguments(c["input"]), _value(c["output"])) for c in cases]
        return {**out, **call_tests(fn_name, calls, "apps")}
    return {**out, **stdin_tests([(c["input"], c["output"]) for c in cases])}


def _value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # text, or nested past the parser
            return value
    return value


def _arguments(value: Any) -> list[Any]:
    value = _value(value)
    return value if isinstance(value, list) else [value]


register(
    Schema(
        name="synthetic1",
        matches=lambda record: "verification_info" in record,
        fields=fields,
        follows="PrimeIntellect/verifiable-coding-problems (SYNTHETIC-1's code problems)",
    )
)
