"""Record schemas: the shapes problem records come in, each one module that registers itself.

A schema recognises a record from its fields and turns it into codepost's own problem fields
(``task_id``, ``prompt``, the tests in one form, a reference solution, limits), keeping the
record's own id. Every place that reads problems (``codepost verify --problems``,
``codepost evaluate``, a stage's ``problems:``, ``POST /verify``) goes through
:func:`problem_fields`, so a new schema module is all it takes to read a new data set. A record
no schema claims is read as codepost's own (HumanEval, MBPP and native records).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...settings.registry import Registry

# Loaded by name (the registry imports every module here on the first look-up): a stage that
# reads problems runs them all, so its resume key holds them all (pipeline/code_version.py).
__modules_loaded_by_name__ = True


class ProblemFormatError(ValueError):
    """A problem record that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class Schema:
    """One record shape.

    ``matches`` says whether a record has this shape (from its fields alone; no two schemas
    may claim one record); ``fields`` reads it into codepost's problem fields, given the
    record's position in its source (the id of a record without one).
    """

    name: str
    matches: Callable[[Mapping[str, Any]], bool]
    fields: Callable[[Mapping[str, Any], int], dict[str, Any]]
    follows: str  # the public record shape, for docs and errors


_SCHEMAS: Registry[Schema] = Registry("record schema", __name__)
_NATIVE = "codepost"  # HumanEval, MBPP and codepost's own records: what no other schema claims


def register(schema: Schema) -> Schema:
    return _SCHEMAS.register(schema.name, schema)


def schemas() -> dict[str, Schema]:
    """Every registered schema by name (the built-in ones are this package's modules)."""
    return _SCHEMAS.all()


def schema_of(record: Mapping[str, Any]) -> Schema:
    """The schema a record has: the one that claims it, else codepost's own."""
    known = schemas()
    claimed = [s for name, s in known.items() if name != _NATIVE and s.matches(record)]
    if len(claimed) > 1:
        names = ", ".join(s.name for s in claimed)
        raise ProblemFormatError(
            f"the record has the fields of several schemas ({names}); rename its columns "
            "to one of them"
        )
    return claimed[0] if claimed else known[_NATIVE]


def problem_fields(record: Any, position: int = 0) -> dict[str, Any]:
    """A record as codepost's problem fields, read by its schema."""
    if not isinstance(record, Mapping):
        raise ProblemFormatError(f"a problem must be a JSON object, got {type(record).__name__}")
    present = {key: value for key, value in record.items() if value is not None}
    return schema_of(present).fields(present, position)


def rename_columns(record: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """``record`` with its columns renamed (``{"statement": "question"}``: a data set with its
    own column names read as one of the known schemas)."""
    return {columns.get(key, key): value for key, value in record.items()}


# -- helpers the schemas share


def first(record: Mapping[str, Any], keys: Iterable[str]) -> Any:
    """The first of ``keys`` the record has; ProblemFormatError naming them all otherwise."""
    keys = tuple(keys)
    for key in keys:
        if key in record:
            return record[key]
    also = f" (also looked for {', '.join(keys[1:])})" if keys[1:] else ""
    raise ProblemFormatError(f"field {keys[0]!r} missing{also}")


def zip_cases(field: str, inputs: Any, outputs: Any) -> list[tuple[Any, Any]]:
    """``(input, output)`` pairs of two parallel lists, which must have one length."""
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ProblemFormatError(f"field {field!r}: inputs and outputs must be lists")
    if len(inputs) != len(outputs):
        raise ProblemFormatError(
            f"field {field!r}: {len(inputs)} inputs but {len(outputs)} outputs"
        )
    return list(zip(inputs, outputs, strict=True))


def json_field(record: Mapping[str, Any], key: str) -> Any:
    """A field that data sets store as a JSON string (or already decoded)."""
    value = record[key]
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError) as exc:  # nested past the parser's stack
        raise ProblemFormatError(f"field {key!r}: not valid JSON: {exc}") from None


def seconds(text: Any) -> float | None:
    """A time limit as data sets write it (``2``, ``"1 second"``, ``"2.5 seconds"``)."""
    number = _leading_number(text)
    return number if number and number > 0 else None


def megabytes(text: Any) -> int | None:
    """A memory limit as data sets write it (``256``, ``"256 megabytes"``)."""
    number = _leading_number(text)
    return int(number) if number and number >= 1 else None


def _leading_number(text: Any) -> float | None:
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = re.match(r"\s*(\d+(?:\.\d+)?)", str(text))
    return float(match.group(1)) if match else None


def call_tests(
    fn_name: str,
    cases: list[tuple[Any, Any]],
    compare: str,
    starter_code: str = "",
    public: list[tuple[Any, Any]] | None = None,
) -> dict[str, Any]:
    """The fields of a call problem: ``(arguments, expected)`` cases compared by ``compare``;
    a chat answer must define ``Solution`` for a LeetCode method, else the function.
    ``public``: the cases a model may see, where the data set ships them."""
    tests: dict[str, Any] = {
        "form": "call",
        "fn_name": fn_name,
        "call": _call_cases(cases),
        "compare": compare,
        "starter_code": starter_code,
    }
    if public is not None:
        tests["public_call"] = _call_cases(public)
    return {
        "entry_point": "Solution" if "class Solution" in starter_code else fn_name,
        "tests": tests,
    }


def _call_cases(cases: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    return [{"args": arguments, "expected": expected} for arguments, expected in cases]


def stdin_tests(
    cases: list[tuple[Any, Any]], public: list[tuple[Any, Any]] | None = None
) -> dict[str, Any]:
    """The fields of a stdin/stdout problem, compared as rllm compares these data sets: with
    LiveCodeBench's ``grade_stdio`` (each line equal as text or as decimals). ``public``: the
    cases a model may see, where the data set ships them."""
    tests: dict[str, Any] = {
        "form": "io",
        "io": _io_cases(cases),
        "checker": {"kind": "tokens", "by_line": True},
    }
    if public is not None:
        tests["public_io"] = _io_cases(public)
    return {"tests": tests}


def _io_cases(cases: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    return [{"input": given, "output": expected} for given, expected in cases]
