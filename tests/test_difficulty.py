"""The difficulty filter keeps exactly the problems whose pass rate lies strictly in range, and
publishes them as a problem set the RL stage can load."""

from __future__ import annotations

import json

import pytest
from stage_helpers import rollout, save_tiny_model, tiny_problem_set, write_rollouts

from codepost.pipeline.checkpoints import manifest as checkpoints
from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.inference.sampling import SamplingConfig
from codepost.pipeline.stages.difficulty_filter import (
    DifficultyFilterConfig,
    run_difficulty_filter,
    select_problems,
)
from codepost.pipeline.stages.registry import kept_problems
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.scoring import ScoreConfig

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
DOUBLE = "```python\ndef double(x):\n    return 2 * x\n```"
WRONG_ADD = "```python\ndef add(a, b):\n    return a - b\n```"
WRONG_NEG = "```python\ndef neg(x):\n    return x\n```"


def test_only_pass_rates_strictly_inside_the_range_are_kept():
    counts = {"none": (4, 0), "one": (4, 1), "half": (4, 2), "three": (4, 3), "all": (4, 4)}
    default = select_problems(counts, DifficultyFilterConfig())
    assert [t for t, r in default.items() if r["kept"]] == ["one", "half", "three"]
    assert default["three"]["pass_rate"] == 0.75
    narrow = DifficultyFilterConfig(min_pass_rate=0.25, max_pass_rate=0.75)
    assert [t for t, r in select_problems(counts, narrow).items() if r["kept"]] == ["half"]
    with pytest.raises(ValueError, match="below max_pass_rate"):
        DifficultyFilterConfig(min_pass_rate=0.5, max_pass_rate=0.5)


@pytest.mark.docker
def test_the_filter_scores_rollouts_and_publishes_the_problems_in_range(tmp_path):
    problems = tiny_problem_set(tmp_path)
    config = DifficultyFilterConfig(
        model=save_tiny_model(tmp_path / "model"),
        problems=problems,
        sampling=SamplingConfig(num_generations=4),
        scoring=ScoreConfig(workers=2, timeout_s=5.0),
    )
    # The stage resumes from its rollouts: these stand for k=4 samples per problem (1: half
    # right, 2: always right, 3: never right), scored for real in the sandbox.
    out = tmp_path / "filter"
    (out / "rollouts").mkdir(parents=True)
    rows = [
        *(rollout("1", text, False, None) for text in (ADD, ADD, WRONG_ADD, WRONG_ADD)),
        *(rollout("2", DOUBLE, False, None) for _ in range(4)),
        *(rollout("3", WRONG_NEG, False, None) for _ in range(4)),
    ]
    for index, row in enumerate(rows):
        row["group_index"] = index % 4
    write_rollouts(out / "rollouts" / "rollouts.parquet", rows)

    path = run_difficulty_filter(config, out)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["task_id"], r["pass_rate"]) for r in kept] == [("1", 0.5)]
    rates = json.loads((path.parent / "pass_rates.json").read_text())
    assert {t: r["pass_rate"] for t, r in rates["problems"].items()} == {
        "1": 0.5, "2": 1.0, "3": 0.0
    }  # fmt: skip
    manifest = checkpoints.read_manifest(path.parent)
    assert manifest.stage == "difficulty-filter" and manifest.metrics["kept"] == 1
    assert checkpoints.verify(path.parent) == []

    # The RL stage loads the kept problems as a problem set, with their tests.
    filtered = kept_problems(
        RLConfig(problems=ProblemSet(shuffle_seed=3)), str(path.parent)
    ).problems
    assert list(load_problem_set(filtered)) == ["1"]
    assert load_problem_set(filtered)["1"] == load_problem_set(problems)["1"]

    # Published: a rerun reuses it; another range in the same folder is refused.
    assert run_difficulty_filter(config, out) == path
    with pytest.raises(FileExistsError, match="another config"):
        run_difficulty_filter(config.model_copy(update={"max_pass_rate": 0.9}), out)
