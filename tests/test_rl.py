"""The RL stage end to end: sample -> score (real Docker sandbox) -> update -> publish ->
refresh, resumed after its last published iteration, on a tiny model with transformers
``generate`` (SmolLM2 with vLLM: tests/test_rl_async.py, against the asynchronous loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engines import saved_tiny_model
from safetensors.torch import load_file
from stage_helpers import SIGNAL, small_rl_config

from codepost.pipeline.checkpoints import manifest as checkpoints
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.rl.metric_names import is_declared
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.rl.trainer_state import SCALARS, TENSORS
from codepost.pipeline.stages.registry import StaleOutputError
from codepost.pipeline.stages.rl import (
    METRICS_FILE,
    RLConfig,
    UpdateStageConfig,
    group_rows,
    is_informative,
    iteration_dir,
    merge_rollouts,
    run_rl,
    run_update,
    uniform_groups,
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
    # dynamic sampling's extra rounds have their own test; every checkpoint kept whole
    config = small_rl_config(tiny_model, EngineConfig(backend="hf")).model_copy(
        update={"save_total_limit": None}
    )
    out = tmp_path / "run"
    assert run_rl(config, out) == iteration_dir(out, 2)
    first = [checkpoints.read_manifest(iteration_dir(out, i)) for i in (1, 2)]
    assert [m.version for m in first] == ["iteration-0001", "iteration-0002"]
    assert first[1].parent == str(iteration_dir(out, 1)) and first[0].stage == "rl-grpo"
    assert {TENSORS, SCALARS} == first[1].state.keys()  # the trainer state is hashed too
    assert [m.steps for m in first] == [1, 2]  # the run's step counts RL's iterations
    rows = metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["update/optimizer_steps"] >= 1 and r["data/samples"] == 6 for r in rows)
    assert all(r["sampler/refresh_probe_diff"] < 1e-5 for r in rows)  # serves the update
    for key in ("reward/mean", "reward/pass_rate", "reward/length/mean", "sampler/logprob_diff/mean",
                "sampler/is_weight/mean", "time/sample_s", "time/score_s", "time/update_s"):  # fmt: skip
        assert key in rows[0]
    assert [key for row in rows for key in row if not is_declared(key)] == []
    assert (out / "reward_curve.png").stat().st_size > 10_000
    assert (out / "rollouts" / "iteration-0002.parquet").is_file()

    # Killed between publishing iteration 2 and recording its metrics row (issue 17, class 8):
    # the rerun restores the row from the iteration's manifest.
    recorded = (out / METRICS_FILE).read_text().splitlines()
    (out / METRICS_FILE).write_text(recorded[0] + "\n")
    run_rl(config.model_copy(update={"iterations": 3}), out)  # resume: only iteration 3 runs
    rows = metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert rows[1]["reward/mean"] == json.loads(recorded[1])["reward/mean"]
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


@pytest.mark.docker
def test_save_total_limit_keeps_the_newest_iterations_and_a_rerun_resumes(tiny_model, tmp_path):
    config = small_rl_config(tiny_model, EngineConfig(backend="hf")).model_copy(
        update={"save_total_limit": 1, "save_best": False}
    )
    out = tmp_path / "run"

    def kept() -> list[str]:
        return sorted(path.name for path in (out / "checkpoints").iterdir())

    assert run_rl(config, out) == iteration_dir(out, 2)
    assert kept() == ["iteration-0002"]
    # A crash in the middle of deleting iteration 1 left it unpublished (its manifest goes first).
    (iteration_dir(out, 1) / "model.safetensors").parent.mkdir()
    (iteration_dir(out, 1) / "model.safetensors").write_bytes(b"partial")
    run_rl(config.model_copy(update={"iterations": 3}), out)
    assert kept() == ["iteration-0003"]
    assert checkpoints.read_manifest(iteration_dir(out, 3)).parent == str(iteration_dir(out, 2))
    assert checkpoints.verify(iteration_dir(out, 3)) == []
    assert [row["iteration"] for row in metrics(out)] == [1, 2, 3]
    # Every iteration's rollouts are covered by the newest checkpoint's manifest (iteration 1's
    # checkpoint is gone): a truncated file is refused naming it, by the merge that makes the
    # stage's `scored` output and by a run extended past it.
    merge_rollouts(out)
    first = out / "rollouts" / "iteration-0001.parquet"
    first.write_bytes(first.read_bytes()[:100])
    with pytest.raises(StaleOutputError, match=r"iteration-0001\.parquet: differs from its digest"):
        merge_rollouts(out)
    with pytest.raises(StaleOutputError, match=r"iteration-0001\.parquet"):
        run_rl(config.model_copy(update={"iterations": 4}), out)
    assert kept() == ["iteration-0003"]


@pytest.mark.docker
def test_by_default_the_newest_and_best_iterations_keep_their_weights_the_newest_its_state(
    tiny_model, tmp_path
):
    """Every iteration kept its weights and a trainer state twice their size: a 135M model's
    main job left 5.6 GB. By default the newest iteration stays whole, and the best one (the
    best pass rate, then reward, of the samples its policy drew next) keeps its weights; a run
    extended later resumes after the newest, from its trainer state."""
    config = small_rl_config(tiny_model, EngineConfig(backend="hf")).model_copy(
        update={"iterations": 3}
    )
    out = tmp_path / "run"

    def best(rows: list[dict]) -> int:  # the policy of iteration j's checkpoint drew row j + 1
        return max(range(1, len(rows)), key=lambda j: (rows[j]["reward/pass_rate"],
                                                       rows[j]["reward/mean"], j))  # fmt: skip

    def kept() -> dict[int, bool]:  # iteration -> whether it holds a trainer state
        return {int(path.name.removeprefix("iteration-")): (path / TENSORS).is_file()
                for path in (out / "checkpoints").iterdir()}  # fmt: skip

    run_rl(config, out)
    assert kept() == {best(metrics(out)): False, 3: True}
    assert all(checkpoints.verify(iteration_dir(out, i)) == [] for i in kept())
    run_rl(config.model_copy(update={"iterations": 4}), out)  # resumes after iteration 3
    rows = metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4]
    assert kept() == {best(rows): False, 4: True}
    assert checkpoints.read_manifest(iteration_dir(out, 4)).parent == str(iteration_dir(out, 3))
    assert all(checkpoints.verify(iteration_dir(out, i)) == [] for i in kept())


def _rollouts(out_dir, iteration: int) -> list[dict]:
    from datasets import Dataset

    path = out_dir / "rollouts" / f"iteration-{iteration:04d}.parquet"
    return Dataset.from_parquet(str(path)).to_list()


def _scored(
    prompt_id: str,
    rewards: list[float],
    excluded: tuple[int, ...] = (),
    passed: list[bool] | None = None,
    fractions: list[float] | None = None,
) -> list[dict]:
    passed = passed or [r >= 1.0 for r in rewards]
    fractions = fractions or [float(p) for p in passed]
    return [
        {
            "prompt_id": prompt_id,
            "group_index": i,
            "reward": r,
            "passed": passed[i],
            "pass_fraction": fractions[i],
            "excluded": i in excluded,
        }
        for i, r in enumerate(rewards)
    ]


def test_a_group_that_fails_every_test_is_dropped_under_pass_and_kept_under_reward():
    # All fail; the format term differs (0.1 for a fenced answer): only `reward` sees a signal.
    format_only = group_rows(_scored("format-only", [0.1, 0.0, 0.1]))[0]
    assert not is_informative(format_only, "pass")
    assert not is_informative(format_only, "tests")
    assert is_informative(format_only, "reward")
    # All fail, but some pass more of the tests: `tests` keeps it, `pass` does not.
    partial = _scored("partial", [0.0, 0.0, 0.0], fractions=[0.0, 0.5, 0.0])
    assert [is_informative(partial, m) for m in ("pass", "tests", "reward")] == [
        False, True, False
    ]  # fmt: skip
    mixed = _scored("mixed", [1.1, 0.1, 0.0])
    assert all(is_informative(mixed, m) for m in ("pass", "tests", "reward"))
    assert uniform_groups([format_only, partial, mixed]) == {
        "data/groups_uniform/pass": 2.0,
        "data/groups_uniform/tests": 1.0,
        "data/groups_uniform/reward": 1.0,
    }
    assert RLConfig().dynamic_sampling_metric == "pass"


def test_dynamic_sampling_drops_exactly_the_groups_whose_rewards_are_all_equal():
    rows = [
        *_scored("all-fail", [0.0, 0.0, 0.0]),
        *_scored("mixed", [0.0, 1.0, 0.0]),
        *_scored("all-pass", [1.0, 1.0, 1.0]),
        *_scored("format-only", [0.1, 0.0, 0.1]),  # no pass, but the rewards differ
        *_scored("equal-once-excluded", [0.0, 0.0, 1.0], excluded=(2,)),
    ]
    rows.insert(4, _scored("mixed", [1.0])[0] | {"group_index": 3})  # interleaved rows
    groups = group_rows(rows)
    assert [g[0]["prompt_id"] for g in groups] == [
        "all-fail", "mixed", "all-pass", "format-only", "equal-once-excluded"
    ]  # fmt: skip
    assert [len(g) for g in groups] == [3, 4, 3, 3, 2]  # the excluded row is left out
    kept = [g[0]["prompt_id"] for g in groups if is_informative(g, "reward")]
    assert kept == ["mixed", "format-only"]
    kept = [g[0]["prompt_id"] for g in groups if is_informative(g)]  # pass: the default
    assert kept == ["mixed"]


def test_the_run_length_is_iterations_or_epochs_not_both():
    assert RLConfig(iterations=3).num_iterations(100) == 3
    by_epochs = RLConfig(iterations=None, epochs=2, prompts_per_iteration=8)
    assert by_epochs.num_iterations(20) == 5  # ceil(2 * 20 / 8)
    with pytest.raises(ValueError, match="iterations` or `epochs"):
        RLConfig(epochs=2)  # iterations keeps its default: ambiguous
    with pytest.raises(ValueError, match="iterations` or `epochs"):
        RLConfig(iterations=None)


@pytest.mark.docker
def test_groups_without_signal_are_resampled_then_skipped(tiny_model, tmp_path):
    """A tiny random model never passes: its rewards vary (a length term) but its test outcomes
    do not, so under `pass` every group is uniform: each iteration samples its extra rounds,
    drops every group and leaves the weights alone; keyed on the reward, the batch fills with
    informative groups and the update runs."""
    base = RLConfig(
        model=tiny_model,
        problems=ProblemSet(limit=6),
        prompt_style="continuation",
        iterations=2,
        prompts_per_iteration=2,
        max_sampling_rounds=3,
        sampling=SamplingConfig(num_generations=3, max_tokens=8),
        engine=EngineConfig(backend="hf"),
        scoring=SIGNAL,
        update=UpdateConfig(learning_rate=1e-2),
    )
    no_signal = tmp_path / "no-signal"
    run_rl(base, no_signal)
    rows = metrics(no_signal)
    assert [r["data/sampling_rounds"] for r in rows] == [3, 3]
    assert [r["data/groups_sampled"] for r in rows] == [6, 6]  # 3 rounds x 2 prompts, all new
    assert [(r["data/groups_trained"], r["data/groups_dropped"]) for r in rows] == [(0, 6), (0, 6)]
    assert [r["update/skipped"] for r in rows] == [1.0, 1.0]
    assert [r["data/schedule_batches"] for r in rows] == [3, 6]
    assert rows[1]["data/epoch"] == 2.0  # 6 batches x 2 prompts over 6 problems
    weights = [
        load_file(folder / "model.safetensors")
        for folder in (iteration_dir(no_signal, 2), Path(tiny_model.name_or_path))
    ]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
    assert not any(r["trained"] for r in _rollouts(no_signal, 1))

    assert [r["data/groups_uniform/pass"] for r in rows] == [6, 6]

    signal = tmp_path / "signal"
    run_rl(base.model_copy(update={"dynamic_sampling_metric": "reward"}), signal)
    rows = metrics(signal)
    assert [r["data/groups_trained"] for r in rows] == [2, 2]
    # Every one of those groups failed every test: `pass` would have dropped them all.
    assert all(r["data/groups_uniform/pass"] == r["data/groups_sampled"] for r in rows)
    assert all(r["data/groups_dropped"] == 2 * r["data/sampling_rounds"] - 2 for r in rows)
    assert all(r["update/optimizer_steps"] >= 1 and "update/skipped" not in r for r in rows)
    assert all(r["trained"] for r in _rollouts(signal, 2))

    # Resume replays the schedule by the batches drawn, not by the iterations.
    run_rl(base.model_copy(update={"iterations": 3}), no_signal)
    assert metrics(no_signal)[2]["data/schedule_batches"] == 9
