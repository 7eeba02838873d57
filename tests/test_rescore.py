"""The rescore stage (added as one module to show what a new stage touches): rollouts scored
by the sandbox for real, then scored again under a reward with a syntax term."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from stage_helpers import SYNTAX, TINY_PROBLEMS, rollout, tiny_problem_set, write_rollouts

from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.stages import get_stage, run_stage
from codepost.pipeline.stages.registry import Artifacts
from codepost.pipeline.stages.rescore import RescoreConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.verifiers import RewardConfig

ADD = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.mark.docker
def test_rollouts_are_scored_again_under_another_reward(tmp_path):
    problems = tiny_problem_set(tmp_path)
    task = str(TINY_PROBLEMS[0]["task_id"])
    rows = [rollout(task, ADD, True, 0.0), rollout(task, SYNTAX, True, 0.0)]  # stale scores
    scored = write_rollouts(tmp_path / "scored.parquet", rows)
    syntax = RewardConfig(weights={"test": 1.0, "syntax": 0.5})
    config = RescoreConfig(problems=problems, scoring=ScoreConfig(workers=1, reward=syntax))
    outputs = run_stage(get_stage("rescore"), config, Artifacts(scored=str(scored)), tmp_path / "o")
    again = pq.read_table(outputs.scored).to_pylist()
    assert [row["passed"] for row in again] == [True, False]
    assert [row["reward"] for row in again] == [1.5, 0.0]
    assert Path(outputs.scored).parent.parent == tmp_path / "o"


def test_a_run_can_rescore_before_mining_pairs():
    config = PostTrainConfig(stages=["sft", "rollouts", "rescore", "pairs", "dpo"])
    assert [entry.stage for entry in config.stages][2] == "rescore"
