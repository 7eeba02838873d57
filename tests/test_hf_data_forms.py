"""Problems in the forms Hugging Face users keep them, built here (no hub): a folder that
``save_to_disk`` wrote (a ``Dataset``, a ``DatasetDict``), a data set repository as a snapshot
holds it (``data/<split>-00000-of-00001.parquet``, jsonl files), and a ``datasets`` object in
Python. Each was refused before with "[Errno 21] Is a directory" or a type error."""

from __future__ import annotations

import json

import datasets
import pytest

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.verifiers import ProblemFormatError, load_problems
from codepost.verifiers.problems import packaged_path


@pytest.fixture(autouse=True)
def no_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a request to the hub would fail the test
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("CODEPOST_CACHE", str(tmp_path / "codepost-cache"))


@pytest.fixture(scope="module")
def mbpp() -> datasets.Dataset:
    """MBPP's first 620 records as they come (task ids 1-620: its prompt, test, validation and
    the start of its train range)."""
    lines = packaged_path("mbpp").read_text().splitlines()[:620]
    return datasets.Dataset.from_list([json.loads(line) for line in lines])


@pytest.fixture(scope="module")
def splits(mbpp) -> datasets.DatasetDict:
    """MBPP as the hub splits it: train 601-620 (here), test 11-510."""
    return datasets.DatasetDict({"train": mbpp.select(range(600, 620)),
                                 "test": mbpp.select(range(10, 510))})  # fmt: skip


def test_a_folder_save_to_disk_wrote_loads(mbpp, splits, tmp_path):
    mbpp.save_to_disk(str(tmp_path / "mbpp"))  # one table: split by MBPP's task-id ranges
    assert len(load_problems(tmp_path / "mbpp")) == 620
    train = load_problem_set(ProblemSet(source=str(tmp_path / "mbpp"), split="train"))
    assert list(train)[:2] == ["601", "602"] and len(train) == 20
    splits.save_to_disk(str(tmp_path / "mbpp-splits"))  # its own splits
    test = load_problem_set(ProblemSet(source=str(tmp_path / "mbpp-splits"), split="test"))
    assert len(test) == 500 and test["11"].test_form == "asserts"
    with pytest.raises(ProblemFormatError, match=r"mbpp-splits: no split 'validation' \(its "
                                                 r"splits: train, test\)"):  # fmt: skip
        load_problems(tmp_path / "mbpp-splits", split="validation")


def test_a_data_set_repository_folder_loads_as_a_snapshot_holds_it(splits, tmp_path):
    repo = tmp_path / "mbpp-repo"
    (repo / "data").mkdir(parents=True)
    for split, table in splits.items():
        table.to_parquet(repo / "data" / f"{split}-00000-of-00001.parquet")
    (repo / ".cache" / "huggingface").mkdir(parents=True)  # `hf download --local-dir`'s own
    (repo / ".cache" / "huggingface" / "download.metadata").write_text("etag, time")
    problem_set = ProblemSet(source=str(repo), split="train")
    assert list(load_problem_set(problem_set))[:1] == ["601"]
    digests = problem_set.content_digests()
    assert sorted(name.rsplit("/", 1)[-1] for name in digests) == [
        "test-00000-of-00001.parquet", "train-00000-of-00001.parquet"]  # fmt: skip
    (repo / ".cache" / "huggingface" / "download.metadata").write_text("a later download")
    assert problem_set.content_digests() == digests  # bookkeeping is not content

    jsonl = tmp_path / "jsonl-repo"
    jsonl.mkdir()
    splits["test"].to_json(jsonl / "test.jsonl")
    assert len(load_problems(jsonl, split="test")) == 500
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProblemFormatError, match="empty: not a data set folder"):
        load_problems(tmp_path / "empty")


def test_a_data_set_object_is_a_source_in_python(mbpp, splits, tmp_path):
    assert len(load_problems(mbpp)) == 620
    assert list(load_problems(splits, split="train"))[:1] == ["601"]
    # A config's source is text (a stage worker, a resume key and Prefect's form hold it): the
    # data set is written once, as Parquet, in a folder named by its content.
    problem_set = ProblemSet(source=mbpp, split="test")
    assert problem_set.source.startswith(str(tmp_path / "codepost-cache" / "datasets"))
    assert ProblemSet(source=mbpp).source == problem_set.source
    assert len(load_problem_set(problem_set)) == 500  # MBPP's ranges, as for a file
    assert json.loads(problem_set.model_dump_json())["source"] == problem_set.source
    by_split = ProblemSet(source=splits, split="train", more_sources=[])
    assert list(load_problem_set(by_split)) == [str(i) for i in range(601, 621)]
    assert ProblemSet(source=splits.filter(lambda row: row["task_id"] != 601)).source != (
        by_split.source
    )
    with pytest.raises(ValueError, match=r"a problem source is text .* not a list"):
        ProblemSet(source=[{"task_id": 1}])
