"""The run config: its default uses only what ships with the package, and settings that cannot
chain are refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.post_train import PostTrainConfig, embedded_default, with_problems
from codepost.pipeline.stages.difficulty_filter import filtered_problem_set
from codepost.pipeline.stages.rl import RLConfig

REPO = Path(__file__).resolve().parents[1]


def _problem_sets(config: PostTrainConfig) -> list[ProblemSet]:
    found = []

    def walk(value: object) -> None:
        if isinstance(value, ProblemSet):
            found.append(value)
        elif hasattr(value, "model_fields"):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(config)
    return found


@pytest.mark.parametrize(
    "config",
    [
        embedded_default(),
        PostTrainConfig.model_validate(
            yaml.safe_load((REPO / "configs" / "learning-mbpp.yaml").read_text())
        ),
    ],
    ids=["embedded-default", "learning-mbpp"],
)
def test_every_default_problem_set_loads_from_the_package(config):
    sets = _problem_sets(config)
    assert {s.source for s in sets} <= {"humaneval", "mbpp"}
    for problem_set in sets:
        assert load_problem_set(problem_set)


def test_the_main_job_evaluates_on_all_of_humaneval():
    (evaluation,) = embedded_default().evaluations.values()
    assert evaluation.problems.limit is None
    assert len(load_problem_set(evaluation.problems)) == 164


def test_dpo_pairs_from_rl_need_an_rl_stage_before_dpo():
    offline = {"several_policies": True}
    with pytest.raises(ValueError, match="needs an 'rl' stage before 'dpo'"):
        PostTrainConfig(stages=["dpo", "rl"], dpo_pairs_from="rl", pairs=offline)
    with pytest.raises(ValueError, match=r"set pairs\.several_policies"):
        PostTrainConfig(stages=["sft", "rl", "dpo"], dpo_pairs_from="rl")
    assert PostTrainConfig(stages=["sft", "rl", "dpo"], dpo_pairs_from="rl", pairs=offline)


def test_a_filter_hands_its_problems_to_the_stages_after_it(tmp_path):
    rl = RLConfig(problems=ProblemSet(source="mbpp", split="train", shuffle_seed=4, limit=8))
    assert with_problems(rl, None) is rl
    handed = with_problems(rl, filtered_problem_set(tmp_path / "filter", rl.problems))
    assert handed.problems.source == str(tmp_path / "filter" / "problems" / "problems.jsonl")
    assert (handed.problems.split, handed.problems.shuffle_seed, handed.problems.limit) == (
        "all",
        4,
        8,
    )
