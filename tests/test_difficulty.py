"""The difficulty filter keeps exactly the problems whose pass rate lies strictly in range, and
publishes them as a problem set the RL stage can load."""

from __future__ import annotations

import json

import pytest
from stage_helpers import rollout, save_tiny_model, tiny_problem_set, write_rollouts

from codepost.pipeline.checkpoints import manifest as checkpoints
from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.rows import TO_COUNT, read_rows
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.stages.difficulty_filter import (
    DifficultyFilterConfig,
    held_out_split,
    run_difficulty_filter,
    select_problems,
)
from codepost.pipeline.stages.registry import filtered_problem_set, kept_problems
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


def filter_config(tmp_path, **settings) -> DifficultyFilterConfig:
    return DifficultyFilterConfig(
        model=save_tiny_model(tmp_path / "model"),
        problems=tiny_problem_set(tmp_path),
        sampling=SamplingConfig(num_generations=4),
        scoring=ScoreConfig(workers=2, timeout_s=5.0),
        **settings,
    )


def write_round(folder, rows) -> None:
    """A round's rollouts of k=4 samples per problem (unscored: the stage scores them)."""
    for index, row in enumerate(rows):
        row["group_index"] = index % 4
    folder.mkdir(parents=True, exist_ok=True)
    write_rollouts(folder / "rollouts.parquet", rows)


def first_round() -> list[dict]:
    """Problem 1 half right, 2 always right, 3 never right."""
    return [
        *(rollout("1", text, False, None) for text in (ADD, ADD, WRONG_ADD, WRONG_ADD)),
        *(rollout("2", DOUBLE, False, None) for _ in range(4)),
        *(rollout("3", WRONG_NEG, False, None) for _ in range(4)),
    ]


@pytest.mark.docker
def test_the_filter_scores_rollouts_and_publishes_the_problems_in_range(tmp_path):
    config = filter_config(tmp_path)
    problems = config.problems
    # The stage resumes from its rollouts, scored for real in the sandbox.
    out = tmp_path / "filter"
    write_round(out / "rollouts", first_round())

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


def test_the_held_out_split_is_seeded_and_spread_over_the_pass_rates():
    rates = {f"t{i}": (i % 5 + 1) / 8 for i in range(20)}  # 4 problems at each of 5 rates
    held = held_out_split(rates, 0.25, seed=0)
    assert len(held) == 5 and held == held_out_split(rates, 0.25, seed=0)
    assert sorted(rates[t] for t in held) == [1 / 8, 2 / 8, 3 / 8, 4 / 8, 5 / 8]  # one per rate
    assert held != held_out_split(rates, 0.25, seed=1)  # ties drawn by the seed
    assert held_out_split(rates, 0.0, seed=0) == set()
    assert len(held_out_split({"a": 0.5, "b": 0.5}, 0.9, seed=0)) == 1  # one stays to train
    with pytest.raises(ValueError, match="max_samples=2 is below"):
        DifficultyFilterConfig(sampling=SamplingConfig(num_generations=4), max_samples=2)
    assert (
        DifficultyFilterConfig(sampling=SamplingConfig(num_generations=4), max_samples=14).rounds
        == 3
    )


@pytest.mark.docker
def test_adaptive_rounds_find_the_rare_pass_and_the_kept_problems_are_split(tmp_path):
    """Round 1 samples every problem k=4 times; problem 3 never passes there, so round 2
    samples it (and only it) 4 more times, where it passes once: kept at 1/8. Round 3 has
    nothing left to find. Half the kept problems are held out."""
    config = filter_config(tmp_path, max_pass_rate=0.9, max_samples=12, held_out_fraction=0.5)
    out = tmp_path / "filter"
    right_neg = "```python\ndef neg(x):\n    return -x\n```"
    write_round(out / "rollouts", first_round())
    write_round(
        out / "rollouts" / "round-02",
        [rollout("3", text, False, None) for text in (WRONG_NEG, right_neg, WRONG_NEG, WRONG_NEG)],
    )

    path = run_difficulty_filter(config, out)
    rates = json.loads((path.parent / "pass_rates.json").read_text())
    assert rates["rounds"] == [
        {"round": 1, "problems_sampled": 3, "samples": 12, "problems_added": 2},
        {"round": 2, "problems_sampled": 1, "samples": 4, "problems_added": 1},
    ]
    assert load_problem_set(
        ProblemSet(source=str(out / "rollouts" / "round-02" / "problems.jsonl"), split="all")
    ).keys() == {"3"}
    assert {t: (r["samples"], r["passed"]) for t, r in rates["problems"].items()} == {
        "1": (4, 2), "2": (4, 4), "3": (8, 1)
    }  # fmt: skip
    train = load_problem_set(filtered_problem_set(out, ProblemSet()))
    held_out = load_problem_set(filtered_problem_set(out, ProblemSet(), "held_out"))
    assert len(train) == len(held_out) == 1 and set(train) | set(held_out) == {"1", "3"}
    manifest = checkpoints.read_manifest(path.parent)
    assert (manifest.metrics["kept"], manifest.metrics["train"], manifest.metrics["held_out"]) == (
        2,
        1,
        1,
    )
    assert manifest.metrics["samples"] == 16
    assert checkpoints.verify(path.parent) == []


def test_a_sample_the_sandbox_failed_on_says_nothing_of_a_problems_difficulty(tmp_path):
    """Problem 2 passed twice in two verdicts (two sandbox errors beside them): 1.0, too easy
    to keep, not 0.5; problem 3 has no verdict at all: not rated. Counted as failures, both
    errors made problem 2 look half solved."""
    config = filter_config(tmp_path)
    out = tmp_path / "filter" / "rollouts"
    verdicts = {"1": ["passed", "failed", "failed", "failed"],
                "2": ["passed", "passed", "sandbox_error", "sandbox_error"],
                "3": ["sandbox_error"] * 4}  # fmt: skip
    rows = [
        rollout(task, ADD, status == "passed", None, status=status)
        for task, statuses in verdicts.items()
        for status in statuses
    ]
    write_round(out, rows)
    write_rollouts(out / "scored.parquet", rows)  # scored already: the stage reads them
    path = run_difficulty_filter(config, tmp_path / "filter")
    rates = json.loads((path.parent / "pass_rates.json").read_text())["problems"]
    assert {t: (r["samples"], r["passed"], r["kept"]) for t, r in rates.items()} == {
        "1": (4, 1, True), "2": (2, 2, False)
    }  # fmt: skip
    assert [json.loads(line)["task_id"] for line in path.read_text().splitlines()] == ["1"]


@pytest.mark.docker
def test_adaptive_rounds_sample_a_real_model_until_the_budget(tmp_path):
    """A tiny random model never passes: every problem is sampled in every round, up to
    max_samples, and the filter then says it found nothing."""
    config = DifficultyFilterConfig(
        model=save_tiny_model(tmp_path / "model"),
        problems=tiny_problem_set(tmp_path),
        sampling=SamplingConfig(num_generations=2, max_tokens=8),
        engine=EngineConfig(backend="hf"),
        scoring=ScoreConfig(workers=2, timeout_s=3.0),
        max_samples=5,  # two rounds of 2; a third would pass the budget
    )
    out = tmp_path / "filter"
    with pytest.raises(ValueError, match="5 samples at most"):
        run_difficulty_filter(config, out)
    assert len(read_rows(out / "rollouts" / "scored.parquet", TO_COUNT)) == 6
    assert len(read_rows(out / "rollouts" / "round-02" / "scored.parquet", TO_COUNT)) == 6
    assert not (out / "rollouts" / "round-03").exists()
