"""Which problems a stage uses: a source (HumanEval, the packaged MBPP, a local file or data
set folder, a ``datasets`` data set, a hub id), or several mixed, and a split.

MBPP's splits are task-id ranges (its README): prompt 1-10, test 11-510, validation 511-600,
train 601-974. The packaged MBPP and any local MBPP file are split by those ranges; a source
with splits of its own (a hub id, a repository folder, a ``DatasetDict``) is split by them.

A ``datasets.Dataset`` or ``DatasetDict`` given as a source in Python is written once as
Parquet under the codepost cache, in a folder named by its content, and the source is that
path: a config stays text that a stage worker, a resume key and Prefect's form can hold.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ...settings.config import Seed, Settings
from ...settings.walk import OutsideInput, settings_of
from ...verifiers import Problem, load_problems
from ...verifiers.problems import (
    HUMANEVAL,
    cap_tests,
    check_source,
    has_splits,
    packaged_path,
    posed_in,
)
from ..atomic import staged
from ..checkpoints.manifest import path_digests, sha256_file
from ..model_config import cache_dir

Split = Literal["train", "validation", "test", "prompt", "all"]
MBPP_SPLITS: dict[str, range] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
}


class ProblemSet(Settings, OutsideInput):
    """A set of problems: where they come from, which split, how many."""

    starts_anew_with = ("source",)  # another source's split, limit... are not this one's

    source: str = Field(
        HUMANEVAL,
        description="'humaneval', 'mbpp', 'mbpp-sanitized', the '*-sample' fixtures (shipped), "
        "a local .jsonl/.json/.parquet file, a local data set folder (save_to_disk's, or a hub "
        "repository's files), a hub id[:config]; in Python also a datasets Dataset",
    )
    split: Split = Field("test", description="MBPP: task-id ranges; hub: the hub's split")
    task_ids: list[str] = Field(
        default_factory=list,
        description="keep only these problems of the split, in this order (before shuffling "
        "and the limit); [] = all",
    )
    limit: int | None = Field(None, ge=1, description="keep the first N (after shuffling)")
    shuffle_seed: Seed | None = Field(
        None, description="shuffle before the limit; None = keep order"
    )
    more_sources: list[str] = Field(
        default_factory=list,
        description="further sources read as source is, their problems joined to its (a mixed "
        "set; task ids must not repeat)",
    )
    language: str | None = Field(
        None,
        description="pose every problem in this language ('cpp': io problems only; "
        "CodeContests' C++ solutions are the references); None = each problem's own",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="rename a data set's own columns to a known schema's ({statement: question})",
    )
    max_tests: int | None = Field(
        None,
        ge=1,
        description="at most this many tests per problem, the longest inputs (rllm keeps 15 "
        "for training rewards); None = all",
    )

    @field_validator("source", mode="before")
    @classmethod
    def _data_set_as_files(cls, source: Any) -> Any:
        return source if isinstance(source, str) else saved_data_set(source)

    @field_validator("more_sources", mode="before")
    @classmethod
    def _data_sets_as_files(cls, sources: Any) -> Any:
        if not isinstance(sources, list):
            return sources
        return [s if isinstance(s, str) else saved_data_set(s) for s in sources]

    def content_digests(self) -> dict[str, str]:
        """Each local source by its content, a packaged set by its packaged file's: a problems
        file edited in place is another input. A hub id is its name, which the config holds."""
        digests: dict[str, str] = {}
        for source in (self.source, *self.more_sources):
            path = packaged_path(source)
            if path.exists():
                digests.update(path_digests(f"problems file {source}", path))
        return digests

    def may_share_problems(self, other: ProblemSet) -> bool:
        """Whether a problem can be in both sets: a source in common (a file however it is
        named), splits that meet (the same, or either 'all'), and task ids that meet where
        both list them. Limits and shuffles are left out: they pick problems at run time."""
        places = {_place(source) for source in (self.source, *self.more_sources)}
        if not places & {_place(source) for source in (other.source, *other.more_sources)}:
            return False
        if self.split != other.split and "all" not in (self.split, other.split):
            return False
        both_listed = self.task_ids and other.task_ids
        return not both_listed or bool(set(self.task_ids) & set(other.task_ids))


def load_problem_set(problem_set: ProblemSet) -> dict[str, Problem]:
    """The problems of ``problem_set``, by task id."""
    problems: dict[str, Problem] = {}
    for source in (problem_set.source, *problem_set.more_sources):
        for task_id, problem in _load_split(source, problem_set).items():
            if task_id in problems:
                raise ValueError(f"{source}: task id {task_id!r} is in an earlier source too")
            problems[task_id] = problem
    problems = posed_in(problems, problem_set.language)
    keys = _chosen(problems, problem_set)
    if problem_set.shuffle_seed is not None:
        random.Random(problem_set.shuffle_seed).shuffle(keys)
    if problem_set.limit is not None:
        keys = keys[: problem_set.limit]
    if not keys:
        raise ValueError(f"{problem_set.source} split {problem_set.split!r}: no problems")
    return cap_tests({k: problems[k] for k in keys}, problem_set.max_tests)


def check_problem_files(config: BaseModel) -> int:
    """Load every local problems file ``config`` names (its stages', its evaluations'): a
    malformed line is refused before the first stage starts, not when a stage reaches it an
    hour in; a name that is neither a set, a file nor a hub id is refused too. A hub data set
    is checked when it is loaded. Returns how many sets it loaded."""
    problem_sets = settings_of(config, ProblemSet)
    for problem_set in problem_sets:
        for source in (problem_set.source, *problem_set.more_sources):
            check_source(source)
    local = [
        problem_set
        for problem_set in problem_sets
        if all(packaged_path(s).exists() for s in (problem_set.source, *problem_set.more_sources))
    ]
    for problem_set in local:
        load_problem_set(problem_set)
    return len(local)


def _place(source: str) -> str:
    """What a source's problems are: a local or packaged file's (or folder's) content, so that
    a copy under another name is the same place; else its name (a hub id)."""
    path = packaged_path(source)
    if not path.exists():
        return source
    files = sorted(path_digests("", path).items())
    return "content " + hashlib.sha256(json.dumps(files).encode()).hexdigest()


def _chosen(problems: dict[str, Problem], problem_set: ProblemSet) -> list[str]:
    if not problem_set.task_ids:
        return list(problems)
    missing = [task_id for task_id in problem_set.task_ids if task_id not in problems]
    if missing:
        raise ValueError(
            f"{problem_set.source} split {problem_set.split!r}: no problem {', '.join(missing)} "
            f"(task_ids)"
        )
    return list(dict.fromkeys(problem_set.task_ids))


def saved_data_set(data_set: Any) -> str:
    """A ``datasets.Dataset`` (one Parquet file) or ``DatasetDict`` (a folder with
    ``data/<split>-00000-of-00001.parquet``, as a hub repository holds its splits), written once
    under ``<cache>/datasets/<sha256 of its Parquet>``; the path, as a source."""
    import datasets

    if not isinstance(data_set, datasets.Dataset | datasets.DatasetDict):
        raise ValueError(
            f"a problem source is text (a name, a path, a hub id) or a datasets Dataset, "
            f"not a {type(data_set).__name__}"
        )
    if isinstance(data_set, datasets.Dataset):
        tables, source = {"data.parquet": data_set}, "data.parquet"
    else:
        tables = {f"data/{s}-00000-of-00001.parquet": t for s, t in data_set.items()}
        source = ""  # the folder
    with tempfile.TemporaryDirectory(prefix="codepost-data-set-") as scratch:
        digests = {}
        for name, table in tables.items():
            (Path(scratch) / name).parent.mkdir(parents=True, exist_ok=True)
            table.to_parquet(Path(scratch) / name)
            digests[name] = sha256_file(Path(scratch) / name)
        key = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:16]
        target = cache_dir() / "datasets" / key
        if not target.exists():
            with staged(target, folder=True) as staging:
                for name in tables:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    (Path(scratch) / name).replace(staging / name)
    return str(target / source)


def _load_split(source: str, problem_set: ProblemSet) -> dict[str, Problem]:
    split = problem_set.split
    is_local = not has_splits(source)
    problems = load_problems(
        source, split="train" if split == "all" else split, columns=problem_set.columns
    )
    if is_local and split != "all" and _is_mbpp(problems):
        ids = MBPP_SPLITS[split]
        return {k: p for k, p in problems.items() if int(k) in ids}
    if is_local and split not in ("all", "test"):
        raise ValueError(
            f"{source}: a local file other than MBPP has no {split!r} split (use 'all' or 'test')"
        )
    return problems


def _is_mbpp(problems: dict[str, Problem]) -> bool:
    return all(p.test_form == "asserts" and k.isdigit() for k, p in problems.items())


def fingerprint(problems: dict[str, Problem]) -> str:
    """A short content hash of a problem set, for checkpoint lineage (order-free: the same
    problems shuffled are the same set)."""
    digest = hashlib.sha256()
    for _, problem in sorted(problems.items()):
        digest.update(json.dumps(problem.model_dump(mode="json"), sort_keys=True).encode())
    return digest.hexdigest()[:16]
