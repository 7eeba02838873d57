"""LiveCodeBench (``code_generation_lite``): ``question_id``, ``question_content``,
``starter_code``, ``public_test_cases`` and ``private_test_cases`` (``{"input", "output",
"testtype"}`` lists: all of them score, the public ones are what a model may see between
turns), ``metadata`` (``func_name`` for functional problems).

The private tests come as LiveCodeBench's loader reads them (``benchmarks/code_generation.py``):
a JSON string, or base64 of zlib of a pickled JSON string. The pickle is read by an unpickler
that builds no object but plain data (no class, no function, nothing it could call) and must
hold a string. Functional inputs are one JSON value per line (the arguments), the output one
JSON value, compared as ``grade_call_based`` compares; stdin outputs as ``grade_stdio``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from typing import Any

from ..bounds import Budget, reading_bounds
from . import (
    ProblemFormatError,
    Schema,
    call_tests,
    first,
    json_field,
    register,
    stdin_tests,
)


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every class or function a pickle names is refused, so no
    code runs and only builtin values (here, one string) can come out."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the private tests name {module}.{name}: not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the private tests hold a persistent reference")


def private_tests(text: str) -> Any:
    """LiveCodeBench's private tests: JSON, or base64(zlib(pickle(JSON string))), refused as
    soon as they inflate past the bound of the problems being read (:mod:`..bounds`), before
    they are unpickled."""
    bounds = reading_bounds()
    budget = bounds.budget
    limit = (
        bounds.unpacked_bytes
        if budget is None
        else min(bounds.unpacked_bytes, budget.unpacked_bytes)
    )
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    except RecursionError as exc:
        raise ProblemFormatError(f"field 'private_test_cases': not valid JSON: {exc}") from None
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(base64.b64decode(text.encode(), validate=True), limit)
        value = None if inflater.unconsumed_tail else PlainUnpickler(io.BytesIO(data)).load()
    except (binascii.Error, zlib.error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ProblemFormatError(
            f"field 'private_test_cases': neither JSON nor LiveCodeBench's packed form ({exc})"
        ) from None
    if inflater.unconsumed_tail and limit < bounds.unpacked_bytes:
        raise ProblemFormatError(
            f"field 'private_test_cases': its packed tests inflate past the {limit} bytes left "
            "of the problems read together's bound on unpacked bytes: send fewer problems in one "
            "request"
        )
    if inflater.unconsumed_tail:
        raise ProblemFormatError(
            f"field 'private_test_cases': its packed tests inflate past {limit} bytes, the most "
            "unpacked here: send fewer tests, or send them as JSON"
        )
    if not isinstance(value, str):
        raise ProblemFormatError(
            f"field 'private_test_cases': the packed tests hold a {type(value).__name__}, "
            "not a JSON string"
        )
    if budget is not None:
        _spend(budget, "unpacked_bytes", len(data), "field 'private_test_cases'")
    return json_field({"private_test_cases": value}, "private_test_cases")


def _spend(budget: Budget, kind: str, amount: int, what: str) -> None:
    try:
        budget.spend(kind, amount, what)
    except ValueError as exc:
        raise ProblemFormatError(str(exc)) from None


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    public = list(json_field(record, "public_test_cases"))
    tests = list(public)
    private = record.get("private_test_cases")
    if private:
        tests += private_tests(private) if isinstance(private, str) else private
    budget = reading_bounds().budget
    if budget is not None:  # counted before a case is built
        _spend(budget, "tests", len(tests), f"its {len(tests)} test cases")
    if not tests or not all(
        isinstance(t, Mapping) and {"input", "output"} <= t.keys() for t in tests
    ):
        raise ProblemFormatError("the test cases need 'input' and 'output'")
    metadata = json_field(record, "metadata") if record.get("metadata") else {}
    starter = str(record.get("starter_code") or "")
    out: dict[str, Any] = {
        "task_id": first(record, ("question_id", "task_id")),
        "prompt": first(record, ("question_content", "prompt")),
    }
    if any(t.get("testtype") == "functional" for t in tests):
        fn_name = metadata.get("func_name") if isinstance(metadata, Mapping) else None
        if not fn_name:
            raise ProblemFormatError("field 'metadata': functional tests need a func_name")
        calls = [_call_case(t) for t in tests]
        return {**out, **call_tests(fn_name, calls, "value", starter, calls[: len(public)])}
    cases = [(t["input"], t["output"]) for t in tests]
    return {**out, **stdin_tests(cases, cases[: len(public)])}


def _call_case(test: Mapping[str, Any]) -> tuple[list[Any], Any]:
    try:
        arguments = [json.loads(line) for line in str(test["input"]).split("\n")]
        return arguments, json.loads(test["output"])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProblemFormatError(
            f"a functional test is not JSON, one value a line: {exc}"
        ) from None


register(
    Schema(
        name="livecodebench",
        matches=lambda record: "public_test_cases" in record,
        fields=fields,
        follows="livecodebench/code_generation_lite (and code_generation)",
    )
)
