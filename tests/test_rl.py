"""The RL stage end to end: sample -> score (real Docker sandbox) -> update -> publish ->
refresh, resumed after its last published iteration; once on a tiny model with transformers
``generate``, once on the real SmolLM2 with vLLM."""

from __future__ import annotations

import json

import pytest
import torch
from engines import TEST_ENGINE, saved_tiny_model
from safetensors.torch import load_file

from codepost.pipeline import checkpoints
from codepost.pipeline.data import ProblemSet
from codepost.pipeline.policy_update import UpdateConfig
from codepost.pipeline.rl import (
    METRICS_FILE,
    RLConfig,
    UpdateStageConfig,
    iteration_dir,
    run_rl,
    run_update,
)
from codepost.pipeline.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.scoring import ScoreConfig
from codepost.verifiers import RewardConfig

# A length penalty past a tiny budget varies within every group: there is always a signal.
SIGNAL = ScoreConfig(
    workers=2,
    timeout_s=3.0,
    reward=RewardConfig(length_weight=1.0, length_budget=1, length_buffer=200),
)


def metrics(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / METRICS_FILE).read_text().splitlines()]


@pytest.fixture
def tiny_model(tmp_path):
    return saved_tiny_model(tmp_path / "tiny")


@pytest.mark.docker
def test_iterations_publish_checkpoints_and_a_rerun_resumes_after_the_last_one(
    tiny_model, tmp_path
):
    config = RLConfig(
        model=tiny_model,
        problems=ProblemSet(limit=3),
        prompt_style="continuation",
        iterations=2,
        prompts_per_iteration=2,
        sampling=SamplingConfig(num_generations=3, max_tokens=12),
        engine=EngineConfig(backend="hf"),
        scoring=SIGNAL,
        update=UpdateConfig(lr=1e-2, sampler_is_cap=2.0),
    )
    out = tmp_path / "run"
    assert run_rl(config, out) == iteration_dir(out, 2)
    first = [checkpoints.read_manifest(iteration_dir(out, i)) for i in (1, 2)]
    assert [m.version for m in first] == ["iteration-0001", "iteration-0002"]
    assert first[1].parent == str(iteration_dir(out, 1)) and first[0].stage == "rl-grpo"
    rows = metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["optimizer_steps"] >= 1 and r["samples"] == 6 for r in rows)
    assert all(r["refresh_probe_diff"] < 1e-5 for r in rows)  # the sampler serves the update
    for key in ("reward_mean", "pass_rate", "reward_length_mean", "sampler_logprob_diff_mean",
                "is_weight_mean", "time_sample_s", "time_score_s", "time_update_s"):  # fmt: skip
        assert key in rows[0]
    assert (out / "reward_curve.png").stat().st_size > 10_000
    assert (out / "rollouts" / "iteration-0002.parquet").is_file()

    run_rl(config.model_copy(update={"iterations": 3}), out)  # resume: only iteration 3 runs
    assert [r["iteration"] for r in metrics(out)] == [1, 2, 3]
    assert [checkpoints.read_manifest(iteration_dir(out, i)) for i in (1, 2)] == first
    assert checkpoints.read_manifest(iteration_dir(out, 3)).parent == str(iteration_dir(out, 2))
    for i in (1, 2, 3):
        assert checkpoints.verify(iteration_dir(out, i)) == []

    # The update stage alone, on iteration 2's rollouts from iteration 1, is iteration 2.
    from_first = tiny_model.model_copy(update={"name_or_path": str(iteration_dir(out, 1))})
    replayed = run_update(
        UpdateStageConfig(model=from_first, update=config.update),
        out / "rollouts" / "iteration-0002.parquet",
        tmp_path / "update",
    )
    manifest = checkpoints.read_manifest(replayed)
    assert (manifest.stage, manifest.version) == ("update-grpo", "policy-0002")
    assert checkpoints.verify(replayed) == []
    weights = [
        load_file(folder / "model.safetensors") for folder in (replayed, iteration_dir(out, 2))
    ]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.allclose(tensor, weights[1][name], atol=1e-6), name


@pytest.mark.slow
@pytest.mark.docker
def test_grpo_on_smollm2_with_vllm_refreshes_the_engine_after_each_update(tmp_path):
    config = RLConfig(
        problems=ProblemSet(limit=4),
        iterations=2,
        prompts_per_iteration=2,
        sampling=SamplingConfig(num_generations=4, max_tokens=40),
        engine=TEST_ENGINE,
        scoring=SIGNAL,
        update=UpdateConfig(lr=1e-5, micro_batch_size=4),
    )
    run_rl(config, tmp_path)
    rows = metrics(tmp_path)
    assert [r["optimizer_steps"] >= 1 for r in rows] == [True, True]
    # The engine's logprobs of the probe equal the trainer's after every in-place refresh, and
    # the next iteration's rollouts were sampled by the updated weights.
    assert all(r["refresh_probe_diff"] < TEST_ENGINE.probe_tolerance for r in rows)
    assert rows[1]["sampler_logprob_diff_mean"] < 1e-3
    assert {r["sampler"][:5] for r in _rollouts(tmp_path, 2)} == {"vllm-"}
    assert {r["sampler_weights"] for r in _rollouts(tmp_path, 2)} == {
        str(iteration_dir(tmp_path, 1))
    }


def _rollouts(out_dir, iteration: int) -> list[dict]:
    from datasets import Dataset

    path = out_dir / "rollouts" / f"iteration-{iteration:04d}.parquet"
    return Dataset.from_parquet(str(path)).to_list()
