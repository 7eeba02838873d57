"""Our GRPO-family loss and gradients agree with TRL 1.16 ``GRPOTrainer`` on the same batch.

TRL's loss is computed without generation: ``GRPOTrainer.compute_loss`` gets the inputs dict
that ``_generate_and_score_completions`` would have produced (prompt/completion ids and masks,
advantages, old and reference logprobs). To make the comparison bite, the policy first takes one
optimizer step, so ratios differ from 1 (clipping is active) and the KL to the reference is > 0.

Advantages are an input here (TRL's group std uses Bessel's correction and eps 1e-4, ours the
population std and 1e-6; the estimators are tested in test_algorithms.py).
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from tiny_models import char_tokenizer, tiny_causal_lm
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer
from update_cases import ALPHABET, gradients, random_rows

from codepost.pipeline.rl.batches import collate_rollouts
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig

GROUP_SIZE = 4
MAX_COMPLETION = 7
BETA = 0.05

# (TRL GRPOConfig overrides, our UpdateConfig overrides, TRL loss x factor = our loss)
CASES = {
    "grpo": ({"loss_type": "grpo"}, {"loss_agg_mode": "seq-mean-token-mean"}, 1.0),
    # Dr.GRPO divides the token sum by a constant: TRL uses max_completion_length, we the
    # number of sequences, so the two differ by exactly that constant (a learning-rate scale).
    "dr_grpo": (
        {"loss_type": "dr_grpo"},
        {"loss_agg_mode": "seq-mean-token-sum"},
        float(MAX_COMPLETION),
    ),
    "bnpo": ({"loss_type": "bnpo"}, {"loss_agg_mode": "token-mean"}, 1.0),
    "dapo-clip-higher-entropy": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "entropy_coef": 0.01},
        {
            "loss_agg_mode": "token-mean",
            "policy_loss": {"name": "vanilla", "clip_high": 0.28},
            "entropy_coef": 0.01,
        },
        1.0,
    ),
    # TRL's default: the KL term times the ratio (unbiased reverse-KL gradient).
    "grpo-ratio-weighted-kl": (
        {"loss_type": "grpo", "use_bias_correction_kl": True},
        {"loss_agg_mode": "seq-mean-token-mean", "kl_ratio_weighted": True},
        1.0,
    ),
    "gspo": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        {"loss_agg_mode": "seq-mean-token-mean", "policy_loss": {"name": "gspo"}},
        1.0,
    ),
}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """TRL builds its reference model from a path, so the tiny model lives on disk."""
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = char_tokenizer(ALPHABET)
    tiny_causal_lm(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def trl_trainer(path, tokenizer, batch_size: int, overrides: dict, out_dir) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        num_generations=GROUP_SIZE,
        max_completion_length=MAX_COMPLETION,
        beta=BETA,
        epsilon=0.2,
        bf16=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        use_cpu=True,
        report_to="none",
        # TRL 1.16 multiplies the KL term by the ratio by default (our kl_ratio_weighted);
        # the cases without it compare the plain k3 penalty of the GRPO paper.
        **{"use_bias_correction_kl": False, **overrides},
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["unused"] * batch_size}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we skip
    return trainer


@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_match_trl_grpo_trainer(case, saved_model, tmp_path):
    trl_overrides, our_overrides, trl_to_ours = CASES[case]
    path, tokenizer = saved_model
    policy = AutoModelForCausalLM.from_pretrained(path)
    config = UpdateConfig(
        **our_overrides,
        learning_rate=3e-2,
        epochs=2,  # more than one step per batch: old logprobs are computed and kept
        micro_batch_size=3,
        kl_in="loss",
        kl_coef=BETA,
        kl_estimator="k3",
        drop_uniform_groups=False,  # TRL keeps every row
    )
    updater = PolicyUpdater(config, policy, ref_model=AutoModelForCausalLM.from_pretrained(path))
    batch = collate_rollouts(random_rows(len(tokenizer), group_size=GROUP_SIZE, seed=1))
    prepared = updater.prepare(batch)
    rows = torch.arange(len(prepared))

    # One step away from the sampling policy, then the gradient we compare.
    updater.backward_minibatch(prepared, rows)
    updater.optimizer.step()
    updater.optimizer.zero_grad(set_to_none=True)
    ours = updater.backward_minibatch(prepared, rows)
    our_grads = gradients(updater)

    trainer = trl_trainer(path, tokenizer, len(batch), trl_overrides, tmp_path)
    trainer.model.load_state_dict(updater.policy.state_dict())
    trainer.model.train()
    b = prepared.batch
    prompt_width = b.prompt_ids.shape[1]
    inputs = {
        "prompt_ids": b.prompt_ids,
        "prompt_mask": (
            torch.arange(prompt_width)[None, :] >= (prompt_width - b.prompt_lengths)[:, None]
        ).long(),
        "completion_ids": b.completion_ids,
        "completion_mask": prepared.loss_mask.long(),
        "advantages": prepared.advantages[:, 0],
        "old_per_token_logps": prepared.old_logprobs,
        "ref_per_token_logps": prepared.ref_logprobs,
        "num_items_in_batch": prepared.loss_mask.sum(),
    }
    theirs = trainer.compute_loss(trainer.model, inputs)
    theirs.backward()
    trl_metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}

    print(
        f"\n[{case}] loss ours={ours['update/loss']:.8f} trl={theirs.item() * trl_to_ours:.8f} "
        f"clipfrac ours=({ours['update/clipfrac_low']:.4f}, {ours['update/clipfrac_high']:.4f}) "
        f"trl=({trl_metrics['clip_ratio/low_mean']:.4f}, {trl_metrics['clip_ratio/high_mean']:.4f}) "
        f"kl ours={ours['update/kl_ref']:.6f} trl={trl_metrics['kl']:.6f}"
    )
    assert ours["update/clipfrac_low"] + ours["update/clipfrac_high"] > 0, (
        "no clipping: weak comparison"
    )
    assert ours["update/kl_ref"] > 1e-4, "policy equals reference: weak comparison"
    assert ours["update/loss"] == pytest.approx(theirs.item() * trl_to_ours, rel=1e-5, abs=1e-7)
    if case != "gspo":  # TRL weighs sequence-level clip fractions per sequence, we per token
        assert ours["update/clipfrac_low"] == pytest.approx(
            trl_metrics["clip_ratio/low_mean"], abs=1e-6
        )
        assert ours["update/clipfrac_high"] == pytest.approx(
            trl_metrics["clip_ratio/high_mean"], abs=1e-6
        )
    assert ours["update/entropy"] == pytest.approx(trl_metrics["entropy"], rel=1e-5)
    if not our_overrides.get("kl_ratio_weighted"):  # TRL then logs the ratio-weighted term
        assert ours["update/kl_ref"] == pytest.approx(trl_metrics["kl"], rel=1e-4)
    trl_grads = {n: p.grad for n, p in trainer.model.named_parameters()}
    for name, grad in our_grads.items():
        torch.testing.assert_close(
            grad, trl_grads[name.removeprefix("policy.")] * trl_to_ours, rtol=1e-4, atol=1e-6
        )
