"""The rollouts contract: one schema, from the pydantic models, for every file; files written the
old way (datasets) still read; a broken file is named with its column and row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stage_helpers import GOOD_SHORT, rollout, write_rollouts

from codepost.pipeline.data.rows import (
    TO_PAIR,
    TO_TRAIN,
    RowsError,
    ScoredRow,
    arrow_schema,
    read_rows,
    write_rows,
)

# The columns and types of the files the stages wrote before the schema was declared.
ON_DISK = {
    "prompt_id": "string",
    "group_index": "int64",
    "prompt": "string",
    "completion": "string",
    "prompt_ids": "list<item: int64>",
    "completion_ids": "list<item: int64>",
    "sampling_logprobs": "list<item: double>",
    "finish_reason": "string",
    "completion_style": "string",
    "temperature": "double",
    "top_p": "double",
    "max_tokens": "int64",
    "sampler": "string",
    "sampler_weights": "string",
    "policy_version": "int64",
    "model_mask": "list<item: int64>",
    "turns": "int64",
    "answers": "list<item: string>",
    "observations": "list<item: string>",
    "episode_end": "string",
    "reward": "double",
    "passed": "bool",
    "status": "string",
    "pass_fraction": "double",
    "excluded": "bool",
    "trained": "bool",
}


def rows(n: int = 20) -> list[dict]:
    return [
        {**rollout(f"task/{i // 4}", GOOD_SHORT, True, 1.0), "group_index": i % 4} for i in range(n)
    ]


def test_the_schema_is_the_models_and_keeps_the_columns_on_disk():
    schema = arrow_schema(ScoredRow)
    assert {field.name: str(field.type) for field in schema} == ON_DISK
    assert set(TO_TRAIN) | set(TO_PAIR) <= set(ScoredRow.model_fields)


def test_a_file_written_with_datasets_reads_back_and_writes_the_same_types(tmp_path):
    old = write_rollouts(tmp_path / "old.parquet", rows())  # how the stages wrote them
    read = read_rows(old, TO_PAIR)
    assert read == pq.read_table(old).to_pylist()
    new = write_rows(read, tmp_path / "new.parquet", TO_PAIR)
    assert pq.read_schema(new).remove_metadata() == pq.read_schema(old).remove_metadata()


def test_a_missing_column_is_named_with_a_hint_when_unscored(tmp_path):
    unscored = [{k: v for k, v in row.items() if k != "passed"} for row in rows()]
    path = write_rollouts(tmp_path / "rollouts.parquet", unscored)
    with pytest.raises(RowsError, match=r"rollouts\.parquet: missing column\(s\) 'passed'.*score"):
        read_rows(path, TO_PAIR)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("completion_ids", None, r"row 17: column 'completion_ids' missing"),
        ("finish_reason", "eos", r"row 17: column 'finish_reason' is 'eos', expected one of"),
        ("status", "crashed", r"row 17: column 'status' is 'crashed'"),
        ("sampling_logprobs", [-0.5], r"row 17: column 'sampling_logprobs' has 1 values for 2"),
    ],
)
def test_a_bad_row_is_named_with_its_file_column_and_row(tmp_path, column, value, message):
    broken = rows()
    broken[17][column] = value
    path = write_rollouts(tmp_path / "rollouts.parquet", broken)
    with pytest.raises(RowsError, match=rf"rollouts\.parquet {message}"):
        read_rows(path, TO_TRAIN)
    with pytest.raises(RowsError, match=message):  # and the writers refuse it too
        write_rows(broken, tmp_path / "again.parquet", TO_TRAIN)
    assert not (tmp_path / "again.parquet").exists()


def test_a_column_of_the_wrong_type_is_named(tmp_path):
    path = tmp_path / "rollouts.parquet"
    table = pa.Table.from_pylist(rows()).set_column(1, "group_index", pa.array(["a"] * 20))
    pq.write_table(table, path)
    with pytest.raises(RowsError, match=r"column 'group_index' has the wrong type string"):
        read_rows(path, TO_TRAIN)
    wrong = rows()
    wrong[3]["reward"] = "high"
    with pytest.raises(RowsError, match=r"row 3: column 'reward' has the wrong type \(str"):
        write_rows(wrong, path, TO_TRAIN)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing\.parquet"):
        read_rows(tmp_path / "nothing.parquet")
