"""A whole run (SFT, one RL iteration, an evaluation after each) reporting to every
tracker at once, offline, at one step for the whole run: SFT's trainer logs under TRL's names
from step 1, RL's iteration metrics under their metrics.jsonl names after SFT's steps, each
evaluation's pass@1 with its interval at the step its model was made, and the report as an
artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_helpers import save_tiny_model, tiny_problem_set
from tracker_readers import offline, read

from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.post_train import PostTrainConfig, run_post_train
from codepost.pipeline.rl.metric_names import ITERATION
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.tracking import STAGE_STEP, TRACKERS, numbers
from codepost.pipeline.training import TrainingSettings

HF = EngineConfig(backend="hf")


@pytest.mark.docker
@pytest.mark.slow
def test_a_run_reports_every_stage_to_every_tracker(tmp_path, monkeypatch):
    offline(monkeypatch, tmp_path)
    problems = tiny_problem_set(tmp_path)
    config = PostTrainConfig(
        run_dir=str(tmp_path / "run"),
        model=save_tiny_model(tmp_path / "tiny"),
        stages=[
            {"stage": "sft", "config": SFTStageConfig(
                problems=problems,
                training=TrainingSettings(max_steps=2, per_device_train_batch_size=3,
                                          logging_steps=1))},
            {"stage": "rl", "config": RLConfig(
                problems=problems, iterations=1, prompts_per_iteration=2,
                dynamic_sampling=False, engine=HF, scoring=ScoreConfig(workers=2),
                sampling=SamplingConfig(num_generations=2, max_tokens=8))},
        ],
        evaluations={"tiny": EvalConfig(problems=problems, sampling=SamplingConfig(max_tokens=8),
                                         engine=HF)},
        report_to=sorted(TRACKERS),
    )  # fmt: skip
    result = run_post_train(config)

    [rl_row] = [json.loads(line) for line in
                next(Path(config.run_dir).glob("rl/*/metrics.jsonl")).read_text().splitlines()]  # fmt: skip
    rl_names = set(numbers(rl_row)) - {ITERATION}
    passed = {row["stage"]: row["greedy pass@1"] for row in result.rows}
    for tracker in sorted(TRACKERS):  # base: step 0, SFT's 2 optimizer steps, RL's iteration
        logged = read(tracker, Path(config.run_dir))
        assert set(logged.runs) == {"run", "sft", "rl"}, (tracker, set(logged.runs))
        assert set(logged.runs["rl"]) >= rl_names, (tracker, rl_names - set(logged.runs["rl"]))
        assert logged.runs["rl"][STAGE_STEP] == {3: 1}, tracker
        assert set(logged.runs["sft"]["train/loss"]) == {1, 2}, (tracker, logged.runs["sft"])
        assert logged.runs["sft"][STAGE_STEP] == {1: 1, 2: 2}, tracker
        pass_at_1 = logged.runs["run"]["eval/tiny/greedy/pass_at_1"]
        assert pass_at_1 == pytest.approx({0: passed["base"], 2: passed["sft"], 3: passed["rl"]}), (
            tracker
        )
        assert set(logged.runs["run"]["eval/tiny/greedy/pass_at_1_ci95_low"]) == {0, 2, 3}
        assert logged.params["stages.1.config.update.algorithm"] == "grpo", tracker
        if tracker != "trackio":  # it links artifacts by name
            assert "report.md" in {Path(a).name for a in logged.artifacts}, tracker
