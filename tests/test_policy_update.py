"""Rollout batching, the update config and the PolicyUpdater's behaviour on a tiny model."""

from __future__ import annotations

import math
import resource
import typing
from dataclasses import replace

import pytest
import torch
from accelerate.state import AcceleratorState
from pydantic import ValidationError
from tiny_models import char_tokenizer, tiny_causal_lm
from update_cases import ALPHABET, minibatch_gradients, random_rows, tiny_case, weights

from codepost.pipeline.data.prompts import Prompt
from codepost.pipeline.inference.generate import generate_rollouts
from codepost.pipeline.logprobs import completion_logits, completion_logprobs
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.rl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    ALGORITHMS,
    POLICY_LOSSES,
    AdvantageInputs,
    Algorithm,
    GAEParams,
    GRPOParams,
    GSPOParams,
    Hyperparameters,
    VanillaParams,
    approx_kl,
    get_advantage_estimator,
    get_policy_loss,
    kl_penalty,
    register_advantage,
    register_algorithm,
    register_policy_loss,
)
from codepost.pipeline.rl.batches import collate_rollouts
from codepost.pipeline.rl.models import ValueModel
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig
from codepost.pipeline.sharding import make_accelerator

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
        ({"lr": 1e-5}, "Extra inputs are not permitted"),
        ({"algorithm": "ppo2"}, "algorithm"),
        ({"learning_rate": 0}, "greater than 0"),
        ({"policy_loss": {"name": "vanilla", "clip_low": 1.0}}, "less than 1"),
        ({"policy_loss": {"name": "vanilla", "dual_clip": 1.0}}, "greater than 1"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode"),
        ({"micro_batch_size": 8, "minibatch_size": 4}, "exceeds minibatch_size"),
        ({"kl_coef": 0.1}, "kl_in='none'"),
        ({"kl_in": "loss"}, "needs kl_coef > 0"),
        ({"kl_in": "loss", "kl_coef": 0.1, "kl_estimator": "k4"}, "kl_estimator"),
        ({"kl_in": "reward", "kl_coef": 0.1, "kl_ratio_weighted": True}, "kl_in='loss'"),
        ({"advantage": {"name": "grpo", "lam": 0.9}}, "advantage.lam"),
        ({"algorithm": "ppo", "advantage": {"name": "gae", "lam": 2.0}}, "lam"),
        ({"policy_loss": {"name": "ppo"}}, "unknown policy loss 'ppo'"),
        ({"policy_loss": {"name": "vanilla", "clip": 0.1}}, "policy_loss.clip"),
        ({"policy_loss": "gspo"}, "as a mapping with its name"),
        ({"advantage": {"lam": 0.9}}, "needs its `name`"),
        ({"algorithm": "dapo", "kl_coef": 0.1}, "kl_in='none'"),
        ({"algorithm": "a2c", "epochs": 2}, "one step on the whole batch"),
        ({"policy_loss": {"name": "pg"}, "minibatch_size": 8}, "no clip"),
    ],
)
def test_config_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        UpdateConfig(**kwargs)


def test_config_agg_modes_are_the_algorithm_registry_modes():
    annotation = UpdateConfig.model_fields["loss_agg_mode"].annotation
    assert set(typing.get_args(annotation)) == set(AGG_MODES)


def test_default_configs_keep_the_settings_from_before_the_registry():
    config = UpdateConfig()
    assert config.estimator is get_advantage_estimator("grpo")
    assert config.advantage == GRPOParams(norm_by_std=True, eps=1e-6)
    assert config.loss is get_policy_loss("vanilla")
    assert config.policy_loss == VanillaParams(clip_low=0.2, clip_high=0.2)
    assert config.loss_agg_mode == "token-mean" and config.kl_in == "none"
    assert not config.needs_critic and not config.needs_reference
    ppo = UpdateConfig(algorithm="ppo")
    assert ppo.needs_critic
    assert ppo.estimator is get_advantage_estimator("gae")
    assert ppo.advantage == GAEParams(gamma=1.0, lam=0.95, whiten=True)


def test_dr_grpo_preset_trains_on_mean_centred_scores_with_a_token_sum_loss():
    config = UpdateConfig(algorithm="dr_grpo", drop_uniform_groups=False)
    assert config.loss_agg_mode == "seq-mean-token-sum"
    updater, batch = tiny_case(config)
    prepared = updater.prepare(batch)
    rewards, groups = batch.rewards, batch.group_ids
    group_means = torch.stack([rewards[groups == g].mean() for g in groups.tolist()])
    expected = (rewards - group_means)[:, None] * batch.response_mask
    torch.testing.assert_close(prepared.advantages, expected)
    grpo, _ = tiny_case(UpdateConfig(drop_uniform_groups=False))
    divided = grpo.prepare(batch).advantages
    assert not torch.allclose(divided, prepared.advantages)  # GRPO divides by the group std


def test_dapo_preset_clips_higher_than_lower_without_kl_and_masks_overlong_completions():
    config = UpdateConfig(algorithm="dapo")
    assert config.loss is get_policy_loss("vanilla")
    assert (config.policy_loss.clip_low, config.policy_loss.clip_high) == (0.2, 0.28)
    assert config.advantage == GRPOParams()
    assert config.loss_agg_mode == "token-mean"
    assert config.kl_in == "none" and not config.needs_reference
    assert config.mask_truncated and config.drop_uniform_groups
    updater, batch = tiny_case(config)
    prepared = updater.prepare(batch)
    assert (prepared.loss_mask.sum(-1) > 0).all()
    assert not prepared.batch.truncated.any()  # truncated rows set baselines, then leave


def test_explicit_fields_override_the_preset():
    dapo = UpdateConfig(
        algorithm="dapo",
        policy_loss={"name": "vanilla", "clip_low": 0.2, "clip_high": 0.3},
        loss_agg_mode="seq-mean-token-mean",
        mask_truncated=False,
    )
    assert dapo.policy_loss == VanillaParams(clip_low=0.2, clip_high=0.3)
    assert dapo.loss_agg_mode == "seq-mean-token-mean" and not dapo.mask_truncated
    dr_grpo = UpdateConfig(algorithm="dr_grpo", advantage={"name": "grpo", "norm_by_std": True})
    assert dr_grpo.advantage == GRPOParams(norm_by_std=True)
    explicit = UpdateConfig(algorithm="dr_grpo", advantage=GRPOParams(norm_by_std=False, eps=1e-3))
    assert explicit.advantage == GRPOParams(norm_by_std=False, eps=1e-3)
    ppo = UpdateConfig(algorithm="ppo", advantage=GAEParams(gamma=0.9, lam=0.8, whiten=False))
    assert ppo.advantage == GAEParams(gamma=0.9, lam=0.8, whiten=False)
    # The sequence-level loss, with the preset's clip restated.
    config = UpdateConfig(
        algorithm="dapo", policy_loss=GSPOParams(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    )
    assert config.loss is get_policy_loss("gspo")
    assert config.policy_loss == GSPOParams(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    config = UpdateConfig(policy_loss={"name": "gspo", "clip_low": 0.1})
    assert config.loss is get_policy_loss("gspo") and config.policy_loss.clip_low == 0.1
    # What a preset filled in is saved with the config and read back the same, and so is a
    # dump of the fields set only (the command line's settings: the estimator keeps its name).
    for name in ALGORITHMS:
        config = UpdateConfig(algorithm=name)
        assert UpdateConfig.model_validate_json(config.model_dump_json()) == config
    set_only = UpdateConfig(advantage=GAEParams(lam=0.9)).model_dump(exclude_unset=True)
    assert set_only == {"advantage": {"name": "gae", "lam": 0.9}}


@pytest.fixture
def registries():
    """Registrations made by a test end with it."""
    saved = [
        (registry, dict(registry)) for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, ALGORITHMS)
    ]
    yield
    for registry, entries in saved:
        registry.clear()
        registry.update(entries)


def test_a_new_algorithm_is_registrations_only_and_trains_through_the_updater(registries):
    class SignParams(Hyperparameters):
        name: typing.Literal["toy_sign"] = "toy_sign"
        scale: float = 1.0

    @register_advantage(SignParams)
    def sign_advantages(inputs, params):
        """+-scale on every token, by whether the sequence beats the batch's mean score."""
        scores = (inputs.token_rewards * inputs.response_mask).sum(-1)
        advantages = params.scale * (scores - scores.mean()).sign()
        return advantages[:, None] * inputs.response_mask, scores[:, None] * inputs.response_mask

    class ReinforceParams(Hyperparameters):
        name: typing.Literal["toy_reinforce"] = "toy_reinforce"

    @register_policy_loss(ReinforceParams)
    def reinforce_loss(inputs, params):
        """Plain REINFORCE: no ratio, no clip."""
        loss = inputs.aggregate(-inputs.advantages * inputs.logprobs)
        kl = approx_kl(inputs.logprobs, inputs.old_logprobs, inputs.response_mask)
        return loss, {"approx_kl": kl}

    register_algorithm(
        "toy",
        Algorithm(SignParams(scale=2.0), ReinforceParams(), loss_agg_mode="seq-mean-token-mean"),
    )
    config = UpdateConfig(algorithm="toy", learning_rate=1e-2, drop_uniform_groups=False)
    assert config.loss_agg_mode == "seq-mean-token-mean"
    explicit = UpdateConfig(algorithm="toy", advantage={"name": "toy_sign", "scale": 0.5})
    assert explicit.advantage == SignParams(scale=0.5)
    updater, batch = tiny_case(config)
    prepared = updater.prepare(batch)
    expected = 2.0 * (batch.rewards - batch.rewards.mean()).sign()
    torch.testing.assert_close(prepared.advantages, expected[:, None] * batch.response_mask)
    before = weights(updater)
    metrics = updater.update(batch)
    assert metrics["update/optimizer_steps"] == 1 and math.isfinite(metrics["update/policy_loss"])
    after = weights(updater)
    assert any(not torch.equal(after[name], before[name]) for name in after)


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
    updater, batch = tiny_case(UpdateConfig(learning_rate=1e-3))
    with torch.no_grad():
        inputs = batch.model_inputs(torch.arange(len(batch)))
        true = completion_logprobs(completion_logits(updater.policy, inputs), inputs.completion_ids)
    shifted = replace(batch, sampling_logprobs=true + 0.25)
    metrics = updater.update(shifted)
    assert metrics["update/ratio/mean"] == pytest.approx(1.0)
    assert metrics["update/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["update/clipfrac_low"] == metrics["update/clipfrac_high"] == 0.0
    assert metrics["sampler/logprob_diff/mean"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["sampler/logprob_diff/max"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["sampler/kl"] > 0
    assert metrics["update/optimizer_steps"] == 1
    for name in (
        "update/policy_loss",
        "update/entropy",
        "update/grad_norm",
        "update/response_length/mean",
        "update/loss",
    ):
        assert name in metrics


def test_uniform_groups_are_dropped_and_an_all_uniform_batch_does_not_step():
    updater, batch = tiny_case(UpdateConfig(learning_rate=1e-2))
    rewards = batch.rewards.clone()
    rewards[batch.group_ids == 0] = 1.0  # group 0 now carries no signal
    metrics = updater.update(replace(batch, rewards=rewards))
    kept = (batch.group_ids != 0).sum() / len(batch)
    assert metrics["update/trained_fraction"] == pytest.approx(kept.item())
    assert metrics["update/optimizer_steps"] == 1

    before = weights(updater)
    flat = replace(batch, rewards=torch.zeros_like(rewards))
    metrics = updater.update(flat)
    assert metrics["update/trained_fraction"] == 0 and metrics["update/optimizer_steps"] == 0
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
    base = {"learning_rate": 5e-2, "epochs": 4, "minibatch_size": 8}
    updater, batch = tiny_case(UpdateConfig(**base))
    full = updater.update(batch)
    updater, batch = tiny_case(UpdateConfig(**base, target_kl=1e-4))
    stopped = updater.update(batch)
    planned = 4 * math.ceil(round(full["update/trained_fraction"] * full["update/rollouts"]) / 8)
    assert planned >= 8
    assert full["update/optimizer_steps"] == planned and full["update/early_stopped"] == 0
    # Step 1 is on-policy (approx KL 0); step 2 measures the move of step 1 and stops.
    assert stopped["update/optimizer_steps"] == 2 and stopped["update/early_stopped"] == 1


@pytest.mark.parametrize(("target", "direction"), [(1e-6, 1), (1e3, -1)])
def test_adaptive_kl_coefficient_moves_toward_its_target(target, direction):
    config = UpdateConfig(
        learning_rate=5e-2, epochs=2, kl_in="loss", kl_coef=0.1,
        adaptive_kl_target=target, adaptive_kl_horizon=100,
    )  # fmt: skip
    updater, batch = tiny_case(config)
    metrics = updater.update(batch)
    assert metrics["update/kl_ref"] > 0
    assert metrics["update/kl_coef"] == 0.1  # the coefficient this update used
    assert (updater.kl_controller.value - 0.1) * direction > 0


def test_ppo_builds_kl_shaped_rewards_gae_targets_and_trains_actor_and_critic():
    config = UpdateConfig(
        algorithm="ppo", learning_rate=1e-2, epochs=2, minibatch_size=8, kl_in="reward",
        kl_coef=0.2, advantage=GAEParams(gamma=0.9, lam=0.8, whiten=True),
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
        AdvantageInputs(rewards, mask, values=prepared.old_values), GAEParams(gamma=0.9, lam=0.8)
    )
    torch.testing.assert_close(prepared.returns, returns)
    torch.testing.assert_close(prepared.returns, (advantages + prepared.old_values) * mask)
    whitened = prepared.advantages[mask.bool()]
    assert whitened.mean() == pytest.approx(0, abs=1e-5)
    assert whitened.std() == pytest.approx(1, abs=1e-2)

    before = weights(updater)
    metrics = updater.update(batch)
    for name in (
        "update/value_loss",
        "update/vf_clipfrac",
        "update/explained_variance",
        "update/value/mean",
        "update/kl_ref",
    ):
        assert name in metrics
    after = weights(updater)
    for part in ("policy.", "critic."):
        assert any(not torch.equal(after[n], before[n]) for n in after if n.startswith(part))


def test_a2c_takes_one_step_on_one_step_td_advantages_and_trains_actor_and_critic():
    updater, batch = tiny_case(UpdateConfig(algorithm="a2c", learning_rate=1e-2))
    updater.update(batch)  # the critic's values move off their initial ones
    prepared = updater.prepare(batch)
    mask, values = prepared.batch.response_mask, prepared.old_values
    assert values.abs().sum() > 0
    # A_t = r_t + V(s_{t+1}) - V(s_t), V = 0 past the last token; the reward on the last one.
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:] * mask[:, 1:]
    last = mask.sum(-1).long() - 1
    rewards = torch.zeros_like(values)
    rewards[torch.arange(len(last)), last] = prepared.batch.rewards
    torch.testing.assert_close(prepared.advantages, (rewards + next_values - values) * mask)

    before = weights(updater)
    metrics = updater.update(batch)
    assert metrics["update/optimizer_steps"] == 1
    assert "update/clipfrac_high" not in metrics and "update/value_loss" in metrics
    after = weights(updater)
    for part in ("policy.", "critic."):
        assert any(not torch.equal(after[n], before[n]) for n in after if n.startswith(part))


def test_lora_trains_only_the_adapters_and_uses_the_base_model_as_reference():
    config = UpdateConfig(learning_rate=1e-2, kl_in="loss", kl_coef=0.1)
    updater, batch = tiny_case(config, model_config=ModelConfig(lora_r=4))
    assert updater.ref_model is None
    before = weights(updater)
    first = updater.update(batch)
    second = updater.update(batch)
    assert (
        first["update/kl_ref"] < 1e-9 < second["update/kl_ref"]
    )  # LoRA B starts at 0: policy == base
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
        updater, batch = tiny_case(UpdateConfig(bf16=bf16, learning_rate=1e-3, epochs=2))
        logprobs[bf16] = updater.prepare(batch).old_logprobs
        metrics = updater.update(batch)
        assert metrics["update/optimizer_steps"] == 2 and math.isfinite(metrics["update/loss"])
    difference = (logprobs[True] - logprobs[False]).abs().max()
    assert 0 < difference < 0.1  # bf16 matmuls, float32 log-softmax


def test_sequence_level_ratio_and_dual_clip_run_through_the_update():
    config = UpdateConfig(learning_rate=5e-2, epochs=3, policy_loss=GSPOParams(dual_clip=3.0))
    updater, batch = tiny_case(config)
    metrics = updater.update(batch)
    assert metrics["update/optimizer_steps"] == 3
    assert metrics["update/clipfrac_low"] + metrics["update/clipfrac_high"] > 0


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
    assert metrics["sampler/is_ratio/max"] > 2.0 >= metrics["sampler/is_weight/mean"]
    assert 0 < metrics["sampler/is_truncated_fraction"] < 1


def test_a_trainer_process_reuses_the_memory_of_large_tensors_instead_of_faulting_it_in_again():
    make_accelerator("no")  # every trainer starts here

    def faults_of_large_tensors() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            torch.ones(16 * 2**20)  # 64 MiB: over glibc's largest mmap threshold
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_of_large_tensors()  # the heap grows once
    assert faults_of_large_tensors() < 2000  # 4 x 16384 pages when each is mapped afresh
