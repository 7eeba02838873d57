"""Shared cases for the policy-update tests, and the worker ``accelerate launch`` runs.

As a script (one process per rank)::

    accelerate launch --multi_gpu --num_processes 2 tests/update_cases.py CONFIG_JSON OUT_DIR [CASE_KWARGS_JSON]

builds the same tiny model and batch as :func:`tiny_case` (given the keyword arguments of
CASE_KWARGS_JSON), runs one full ``update`` and one gradient pass, and rank 0 saves the
gradients, the updated weights and the metrics.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.launch import leave_process_group
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.rl.batches import RolloutBatch, collate_rollouts
from codepost.pipeline.rl.models import ValueModel
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig

ALPHABET = "def():\n rtun0123456789+"


def random_rows(
    vocab_size: int,
    *,
    num_prompts: int = 4,
    group_size: int = 4,
    max_prompt_len: int = 8,
    max_completion_len: int = 7,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rollout rows of random tokens with ragged lengths and mixed rewards (0, 0.5, 1)."""
    gen = torch.Generator().manual_seed(seed)

    def randint(low: int, high: int, size: tuple[int, ...] = ()) -> torch.Tensor:
        return torch.randint(low, high, size, generator=gen)

    rows = []
    for p in range(num_prompts):
        prompt = randint(3, vocab_size, (int(randint(2, max_prompt_len + 1)),)).tolist()
        for g in range(group_size):
            length = int(randint(1, max_completion_len + 1))
            rows.append(
                {
                    "prompt_id": f"p{p}",
                    "group_index": g,
                    "prompt_ids": prompt,
                    "completion_ids": randint(1, vocab_size, (length,)).tolist(),
                    "sampling_logprobs": (-3 * torch.rand(length, generator=gen)).tolist(),
                    "finish_reason": "length" if length == max_completion_len else "stop",
                    "temperature": 1.0,
                    "reward": float(randint(0, 3)) / 2,
                }
            )
    return rows


def tiny_case(
    config: UpdateConfig,
    *,
    model_config: ModelConfig | None = None,
    seed: int = 0,
    reference_seed: int | None = None,
    **row_kwargs: Any,
) -> tuple[PolicyUpdater, RolloutBatch]:
    """A fresh updater on the seeded tiny model (plus reference/critic as the config needs).

    The reference is a copy of the policy, as at the start of a run, or with
    ``reference_seed`` another random model: at policy == reference the KL term's gradient is
    float noise, so only a different reference tests how that term is scaled and aggregated.
    """
    model_config = model_config or ModelConfig()
    tokenizer = char_tokenizer(ALPHABET)
    policy = tiny_causal_lm(len(tokenizer), seed=seed)
    ref_model = None
    if config.needs_reference and not model_config.lora_r:
        ref_model = (
            copy.deepcopy(policy)
            if reference_seed is None
            else tiny_causal_lm(len(tokenizer), seed=reference_seed)
        )
    critic = ValueModel.from_policy(policy) if config.needs_critic else None
    updater = PolicyUpdater(
        config, policy, model_config=model_config, ref_model=ref_model, critic=critic
    )
    batch = collate_rollouts(random_rows(len(tokenizer), seed=seed, **row_kwargs))
    return updater, batch


def gradients(updater: PolicyUpdater) -> dict[str, torch.Tensor]:
    """Current gradients of every trainable parameter of policy and critic."""
    return {
        name: param.grad.detach().clone()
        for name, param in updater.actor_critic.named_parameters()
        if param.requires_grad and param.grad is not None
    }


def weights(updater: PolicyUpdater) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in updater.actor_critic.named_parameters()}


def minibatch_gradients(updater: PolicyUpdater, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """Gradient of the whole batch as one minibatch (no optimizer step)."""
    prepared = updater.prepare(batch)
    updater.optimizer.zero_grad(set_to_none=True)
    updater.backward_minibatch(prepared, torch.arange(len(prepared)))
    return gradients(updater)


def _worker(config_json: str, out_dir: str, case_kwargs_json: str = "{}") -> None:
    config = UpdateConfig.model_validate_json(config_json)
    updater, batch = tiny_case(config, **json.loads(case_kwargs_json))
    grads = minibatch_gradients(updater, batch)
    updater.optimizer.zero_grad(set_to_none=True)
    metrics = updater.update(batch)
    if updater.accelerator.is_main_process:
        out = Path(out_dir)
        torch.save(grads, out / "grads.pt")
        torch.save(weights(updater), out / "weights.pt")
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "world.txt").write_text(str(updater.accelerator.num_processes))
    leave_process_group(updater.accelerator)


if __name__ == "__main__":
    _worker(*sys.argv[1:])
