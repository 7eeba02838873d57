"""Rollout batching, the update config and the PolicyUpdater's behaviour on a tiny model."""

from __future__ import annotations

import math
import typing
from dataclasses import replace

import pytest
import torch
from accelerate.state import AcceleratorState
from pydantic import ValidationError
from update_cases import ALPHABET, minibatch_gradients, random_rows, tiny_case, weights

from codepost.pipeline.data.prompts import Prompt
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.rl.algorithms import AGG_MODES, get_advantage_estimator, kl_penalty
from codepost.pipeline.rl.models import (
    ValueModel,
    char_tokenizer,
    completion_logits,
    completion_logprobs,
    tiny_causal_lm,
)
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig
from codepost.pipeline.rl.rollouts import collate_rollouts, generate_rollouts

# --------------------------------------------------------------------------------------------
# Rollouts -> batches
# --------------------------------------------------------------------------------------------


def test_collate_takes_masks_from_lengths_even_when_pad_is_eos():
    tokenizer = char_tokenizer(ALPHABET, pad_is_eos=True)
    eos = tokenizer.eos_token_id
    assert tokenizer.pad_token_id == eos
    rows = [
        {"prompt_id": "a", "group_index": 0, "prompt_ids": [5, 6, 7],
         "completion_ids": [8, eos], "sampling_logprobs": [-1.0, -2.0],
         "finish_reason": "stop", "temperature": 1.0, "reward": 1.0},
        {"prompt_id": "b", "group_index": 0, "prompt_ids": [9],
         "completion_ids": [eos, eos, 8, eos], "sampling_logprobs": [-1.0, -1.0, -1.0, -1.0],
         "finish_reason": "length", "temperature": 1.0, "reward": 0.0},
        {"prompt_id": "a", "group_index": 1, "prompt_ids": [5, 6, 7],
         "completion_ids": [eos], "sampling_logprobs": [None],
         "finish_reason": "stop", "temperature": 1.0, "reward": 0.5},
    ]  # fmt: skip
    batch = collate_rollouts(rows, pad_token_id=eos)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [eos, eos, 9], [5, 6, 7]]
    assert batch.group_ids.tolist() == [0, 1, 0]
    assert batch.truncated.tolist() == [False, True, False]
    assert torch.isnan(batch.sampling_logprobs[2, 0])
    inputs = batch.model_inputs(torch.tensor([1]))
    assert inputs.attention_mask.tolist() == [[1, 1, 1, 1, 1]]
    assert inputs.input_ids.tolist() == [[9, eos, eos, 8, eos]]


def _row(**overrides):
    row = {"prompt_id": "a", "group_index": 0, "prompt_ids": [5], "completion_ids": [6, 7],
           "sampling_logprobs": [-1.0, -1.0], "finish_reason": "stop", "temperature": 1.0, "reward": 1.0}  # fmt: skip
    row.update(overrides)
    return row


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            [{k: v for k, v in _row().items() if k != "reward"}],
            r"lacks required fields \['reward'\]",
        ),
        ([_row(sampling_logprobs=[-1.0])], "1 sampling_logprobs for 2 completion tokens"),
        ([_row(finish_reason="abort")], "finish_reason 'abort'"),
        ([_row(reward=float("nan"))], "non-finite reward"),
        ([_row(completion_ids=[], sampling_logprobs=[])], "empty completion"),
        ([_row(), _row()], "duplicate row prompt_id='a' group_index=0"),
        ([], "empty list"),
    ],
)
def test_collate_rejects_bad_rows_naming_the_problem(rows, match):
    with pytest.raises(ValueError, match=match):
        collate_rollouts(rows)


def test_completion_logprobs_match_an_unpadded_forward_of_each_row():
    """Left-padded prompts, right-padded completions, explicit positions and trimmed
    micro-batches must give each row the logprobs it has alone."""
    tokenizer = char_tokenizer(ALPHABET)
    model = tiny_causal_lm(len(tokenizer))
    rows = random_rows(len(tokenizer), seed=3)
    batch = collate_rollouts(rows)
    with torch.no_grad():
        for subset in (torch.arange(len(batch)), torch.tensor([3, 1])):
            inputs = batch.model_inputs(subset)
            logprobs = completion_logprobs(completion_logits(model, inputs), inputs.completion_ids)
            for j, i in enumerate(subset.tolist()):
                ids = torch.tensor([rows[i]["prompt_ids"] + rows[i]["completion_ids"]])
                start = len(rows[i]["prompt_ids"])
                alone = model(ids).logits[0, start - 1 : -1].log_softmax(-1)
                expected = alone.gather(-1, ids[0, start:, None]).squeeze(-1)
                torch.testing.assert_close(logprobs[j, : len(expected)], expected)


def test_each_rows_sampling_temperature_divides_its_logits():
    tokenizer = char_tokenizer(ALPHABET)
    model = tiny_causal_lm(len(tokenizer))
    rows = random_rows(len(tokenizer))
    plain = collate_rollouts(rows).model_inputs(torch.arange(4))
    rows[1]["temperature"] = rows[3]["temperature"] = 0.5
    hot = collate_rollouts(rows).model_inputs(torch.arange(4))
    with torch.no_grad():
        expected = (
            completion_logits(model, plain) * torch.tensor([1.0, 2.0, 1.0, 2.0])[:, None, None]
        )
        torch.testing.assert_close(completion_logits(model, hot), expected)


def test_greedy_rows_cannot_train():
    rows = random_rows(10)
    rows[2]["temperature"] = 0.0
    with pytest.raises(ValueError, match=r"temperature 0\.0"):
        collate_rollouts(rows)


def test_generated_rows_follow_the_contract_and_their_logprobs_are_the_trainers():
    tokenizer = char_tokenizer(ALPHABET, pad_is_eos=True)
    model = tiny_causal_lm(len(tokenizer))
    torch.manual_seed(0)
    prompts = [
        Prompt("f", "def f():\n    return ", "continuation"),
        Prompt("g", "def g(): ", "continuation"),
    ]
    rows = generate_rollouts(
        model, tokenizer, prompts, num_generations=6, max_new_tokens=30, policy_version=3
    )
    assert [(r["prompt_id"], r["group_index"]) for r in rows] == [
        (p, g) for p in "fg" for g in range(6)
    ]
    assert {r["finish_reason"] for r in rows} == {"stop", "length"}  # 30 tokens: both occur
    for row in rows:
        assert row["policy_version"] == 3
        assert row["sampler"] == "hf-generate"
        ids = row["completion_ids"]
        assert len(row["sampling_logprobs"]) == len(ids)
        assert (row["finish_reason"] == "stop") == (ids[-1] == tokenizer.eos_token_id)
        assert tokenizer.eos_token_id not in ids[:-1]
        assert row["completion"] == tokenizer.decode(ids, skip_special_tokens=True)
    for row in rows:
        row["reward"] = 0.0
    batch = collate_rollouts(rows)
    inputs = batch.model_inputs(torch.arange(len(batch)))
    with torch.no_grad():
        logprobs = completion_logprobs(completion_logits(model, inputs), inputs.completion_ids)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(logprobs[mask], batch.sampling_logprobs[mask], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learning_rate": 1e-5}, "Extra inputs are not permitted"),
        ({"algorithm": "ppo2"}, "algorithm"),
        ({"lr": 0}, "greater than 0"),
        ({"clip_low": 1.0}, "less than 1"),
        ({"dual_clip": 1.0}, "greater than 1"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode"),
        ({"micro_batch_size": 8, "minibatch_size": 4}, "exceeds minibatch_size"),
        ({"kl_coef": 0.1}, "kl_in='none'"),
        ({"kl_in": "loss"}, "needs kl_coef > 0"),
        ({"kl_in": "loss", "kl_coef": 0.1, "kl_estimator": "k4"}, "kl_estimator"),
        ({"kl_in": "reward", "kl_coef": 0.1, "kl_ratio_weighted": True}, "kl_in='loss'"),
    ],
)
def test_config_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        UpdateConfig(**kwargs)


def test_config_agg_modes_are_the_algorithm_registry_modes():
    annotation = UpdateConfig.model_fields["loss_agg_mode"].annotation
    assert set(typing.get_args(annotation)) == set(AGG_MODES)


def test_updater_checks_its_models_against_the_config():
    model = tiny_causal_lm(len(ALPHABET) + 3)
    with pytest.raises(ValueError, match="needs a critic"):
        PolicyUpdater(UpdateConfig(algorithm="ppo"), model)
    with pytest.raises(ValueError, match="does not use a critic"):
        PolicyUpdater(UpdateConfig(), model, critic=ValueModel.from_policy(model))
    with pytest.raises(ValueError, match="needs a ref_model"):
        PolicyUpdater(UpdateConfig(kl_in="loss", kl_coef=0.1), model)


# --------------------------------------------------------------------------------------------
# Update behaviour
# --------------------------------------------------------------------------------------------


def test_first_step_is_on_policy_and_measures_the_sampler_mismatch():
    """One step per batch: the old logprobs come from the step's own forward (ratio 1), and the
    sampler's logprobs, here off by 0.25, are compared with the trainer's."""
    updater, batch = tiny_case(UpdateConfig(lr=1e-3))
    with torch.no_grad():
        inputs = batch.model_inputs(torch.arange(len(batch)))
        true = completion_logprobs(completion_logits(updater.policy, inputs), inputs.completion_ids)
    shifted = replace(batch, sampling_logprobs=true + 0.25)
    metrics = updater.update(shifted)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["clipfrac_low"] == metrics["clipfrac_high"] == 0.0
    assert metrics["sampler_logprob_diff_mean"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["sampler_logprob_diff_max"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["sampler_kl"] > 0
    assert metrics["optimizer_steps"] == 1
    for name in ("policy_loss", "entropy", "grad_norm", "response_length_mean", "loss"):
        assert name in metrics


def test_uniform_groups_are_dropped_and_an_all_uniform_batch_does_not_step():
    updater, batch = tiny_case(UpdateConfig(lr=1e-2))
    rewards = batch.rewards.clone()
    rewards[batch.group_ids == 0] = 1.0  # group 0 now carries no signal
    metrics = updater.update(replace(batch, rewards=rewards))
    kept = (batch.group_ids != 0).sum() / len(batch)
    assert metrics["trained_fraction"] == pytest.approx(kept.item())
    assert metrics["optimizer_steps"] == 1

    before = weights(updater)
    flat = replace(batch, rewards=torch.zeros_like(rewards))
    metrics = updater.update(flat)
    assert metrics["trained_fraction"] == 0 and metrics["optimizer_steps"] == 0
    for name, value in weights(updater).items():
        assert torch.equal(value, before[name])


@pytest.mark.parametrize("mask_truncated", [True, False])
def test_mask_truncated_takes_truncated_completions_out_of_the_gradient(mask_truncated):
    config = UpdateConfig(mask_truncated=mask_truncated, drop_uniform_groups=False)
    updater, batch = tiny_case(config)
    truncated = int(batch.truncated.nonzero()[0])
    grads = minibatch_gradients(updater, batch)

    changed_ids = batch.completion_ids.clone()
    changed_ids[truncated] = (changed_ids[truncated] + 1) % 20 + 3
    changed = replace(batch, completion_ids=changed_ids)
    updater2, _ = tiny_case(config)
    grads2 = minibatch_gradients(updater2, changed)
    same = all(torch.allclose(grads[n], grads2[n], atol=1e-7) for n in grads)
    assert same == mask_truncated


def test_early_stop_when_the_policy_leaves_the_sampling_policy():
    base = {"lr": 5e-2, "epochs": 4, "minibatch_size": 8}
    updater, batch = tiny_case(UpdateConfig(**base))
    full = updater.update(batch)
    updater, batch = tiny_case(UpdateConfig(**base, target_kl=1e-4))
    stopped = updater.update(batch)
    planned = 4 * math.ceil(round(full["trained_fraction"] * full["rollouts"]) / 8)
    assert planned >= 8
    assert full["optimizer_steps"] == planned and full["early_stopped"] == 0
    # Step 1 is on-policy (approx KL 0); step 2 measures the move of step 1 and stops.
    assert stopped["optimizer_steps"] == 2 and stopped["early_stopped"] == 1


@pytest.mark.parametrize(("target", "direction"), [(1e-6, 1), (1e3, -1)])
def test_adaptive_kl_coefficient_moves_toward_its_target(target, direction):
    config = UpdateConfig(
        lr=5e-2, epochs=2, kl_in="loss", kl_coef=0.1,
        adaptive_kl_target=target, adaptive_kl_horizon=100,
    )  # fmt: skip
    updater, batch = tiny_case(config)
    metrics = updater.update(batch)
    assert metrics["kl_ref"] > 0
    assert metrics["kl_coef"] == 0.1  # the coefficient this update used
    assert (updater.kl_controller.value - 0.1) * direction > 0


def test_ppo_builds_kl_shaped_rewards_gae_targets_and_trains_actor_and_critic():
    config = UpdateConfig(
        algorithm="ppo", lr=1e-2, epochs=2, minibatch_size=8, kl_in="reward", kl_coef=0.2,
        gamma=0.9, lam=0.8,
    )  # fmt: skip
    updater, batch = tiny_case(config)
    updater.update(batch)  # move policy and critic away from the reference and zero values
    prepared = updater.prepare(batch)
    mask = prepared.batch.response_mask
    kl = kl_penalty(prepared.old_logprobs, prepared.ref_logprobs, "k3") * mask
    assert kl.abs().sum() > 0 and prepared.old_values.abs().sum() > 0
    last = mask.sum(-1).long() - 1
    rewards = -0.2 * kl
    rewards[torch.arange(len(last)), last] += prepared.batch.rewards
    advantages, returns = get_advantage_estimator("gae")(
        rewards, mask, values=prepared.old_values, gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(prepared.returns, returns)
    torch.testing.assert_close(prepared.returns, (advantages + prepared.old_values) * mask)
    whitened = prepared.advantages[mask.bool()]
    assert whitened.mean() == pytest.approx(0, abs=1e-5)
    assert whitened.std() == pytest.approx(1, abs=1e-2)

    before = weights(updater)
    metrics = updater.update(batch)
    for name in ("value_loss", "vf_clipfrac", "explained_variance", "value_mean", "kl_ref"):
        assert name in metrics
    after = weights(updater)
    for part in ("policy.", "critic."):
        assert any(not torch.equal(after[n], before[n]) for n in after if n.startswith(part))


def test_lora_trains_only_the_adapters_and_uses_the_base_model_as_reference():
    config = UpdateConfig(lr=1e-2, kl_in="loss", kl_coef=0.1)
    updater, batch = tiny_case(config, model_config=ModelConfig(lora_r=4))
    assert updater.ref_model is None
    before = weights(updater)
    first = updater.update(batch)
    second = updater.update(batch)
    assert first["kl_ref"] < 1e-9 < second["kl_ref"]  # LoRA B starts at 0: policy == base
    after = weights(updater)
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_gradient_checkpointing_gives_the_same_gradient():
    grads = {}
    for checkpointing in (False, True):
        config = UpdateConfig(kl_in="loss", kl_coef=0.1)
        updater, batch = tiny_case(
            config, model_config=ModelConfig(gradient_checkpointing=checkpointing)
        )
        grads[checkpointing] = minibatch_gradients(updater, batch)
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-7)


@pytest.fixture
def fresh_accelerator_state():
    """Mixed precision is process-wide accelerate state: reset it around the test."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_bf16_autocasts_the_forward_but_keeps_float32_logprobs(fresh_accelerator_state):
    logprobs = {}
    for bf16 in (False, True):
        AcceleratorState._reset_state(reset_partial_state=True)
        updater, batch = tiny_case(UpdateConfig(bf16=bf16, lr=1e-3, epochs=2))
        logprobs[bf16] = updater.prepare(batch).old_logprobs
        metrics = updater.update(batch)
        assert metrics["optimizer_steps"] == 2 and math.isfinite(metrics["loss"])
    difference = (logprobs[True] - logprobs[False]).abs().max()
    assert 0 < difference < 0.1  # bf16 matmuls, float32 log-softmax


def test_sequence_level_ratio_and_dual_clip_run_through_the_update():
    config = UpdateConfig(lr=5e-2, epochs=3, ratio_level="sequence", dual_clip=3.0)
    updater, batch = tiny_case(config)
    metrics = updater.update(batch)
    assert metrics["optimizer_steps"] == 3
    assert metrics["clipfrac_low"] + metrics["clipfrac_high"] > 0


def test_truncated_importance_sampling_weighs_tokens_by_the_capped_trainer_sampler_ratio():
    updater, _ = tiny_case(UpdateConfig(sampler_is_cap=2.0, drop_uniform_groups=False))
    plain, _ = tiny_case(UpdateConfig(drop_uniform_groups=False))
    rows = random_rows(len(char_tokenizer(ALPHABET)))
    for row in rows[::2]:  # the sampler found these tokens far less likely than the trainer
        row["sampling_logprobs"] = [lp - 4.0 for lp in row["sampling_logprobs"]]
    batch = collate_rollouts(rows)
    corrected, uncorrected = updater.prepare(batch), plain.prepare(batch)
    ratio = torch.exp(corrected.old_logprobs - batch.sampling_logprobs)
    mask = batch.response_mask.bool()
    expected = uncorrected.advantages * ratio.clamp(max=2.0)
    torch.testing.assert_close(corrected.advantages[mask], expected[mask])
    assert (ratio[mask] > 2.0).any() and (ratio[mask] < 2.0).any()
    metrics = corrected.metrics
    assert metrics["is_ratio_max"] > 2.0 >= metrics["is_weight_mean"]
    assert 0 < metrics["is_truncated_fraction"] < 1
