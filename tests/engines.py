"""Shared settings and helpers for tests that run real sampling engines.

Every test uses :data:`TEST_ENGINE`, so one vLLM engine (process-wide cache) serves the whole
test session, refreshed to whichever weights a test asks for.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.inference.sampling import EngineConfig
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer

# One thread: the suite's engines sample a few tokens at a time on cores that Docker and the
# tests share, where one thread is the faster (docs/stages.md).
TEST_ENGINE = EngineConfig(max_model_len=1024, cpu_kv_cache_gib=1.0, cpu_threads=1)

ROLLOUT_KEYS = {
    "prompt_id", "group_index", "prompt", "completion", "prompt_ids", "completion_ids",
    "sampling_logprobs", "finish_reason", "completion_style", "temperature", "top_p",
    "max_tokens", "sampler", "sampler_weights", "policy_version",
}  # fmt: skip


def saved_tiny_model(folder: Path, hidden_size: int = 32) -> ModelConfig:
    """A tiny random Llama with a character tokenizer, saved as a model folder: the stages load
    it like any checkpoint (continuation prompts: it has no chat template). vLLM's CPU attention
    needs ``hidden_size`` >= 128 (a head size of 32)."""
    tokenizer = char_tokenizer("abcdefghijklmnopqrstuvwxyz_():,\n =+-0123456789", pad_is_eos=True)
    tiny_causal_lm(len(tokenizer), hidden_size=hidden_size).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return ModelConfig(name_or_path=str(folder))


def perturbed_copy(model: ModelConfig, target: Path, scale: float, seed: int = 0) -> Path:
    """``model`` with Gaussian noise added to every weight, saved as a model folder."""
    policy = load_causal_lm(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    policy.save_pretrained(target)
    load_tokenizer(model).save_pretrained(target)
    return target


def changed_copy(
    source: Path, target: Path, change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> Path:
    """A model folder with ``source``'s config and its (first file's) weights as ``change``
    makes them: the right model by its config, weights that may not fit it."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True)
    shutil.copy(source / "config.json", target / "config.json")
    [weights, *_] = sorted(source.glob("*.safetensors"))
    save_file(change(load_file(weights)), target / "model.safetensors")
    return target


def one_tensor_copy(source: Path, target: Path) -> Path:
    """Only the first tensor of ``source``'s weights."""
    return changed_copy(source, target, lambda tensors: dict([next(iter(tensors.items()))]))


@torch.no_grad()
def recomputed_logprobs(model: torch.nn.Module, row: dict, temperature: float) -> torch.Tensor:
    """The trainer's logprobs of a row's completion tokens (float32, temperature applied)."""
    prompt, completion = row["prompt_ids"], row["completion_ids"]
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
