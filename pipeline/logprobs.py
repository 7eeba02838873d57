"""Completion log-probabilities from one forward over prompt + completion: what the transformers
sampler records and the policy update trains on, computed alike.

Logits are computed only at the positions that predict completion tokens (``logits_to_keep``),
in float32: the vocabulary projection of the prompt is never materialised, and the ratio
``exp(logp - old_logp)`` is not swamped by bf16 rounding. Prompts are left-padded and
completions right-padded, so every completion starts at the same column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelInputs:
    """One forward's worth of rows, trimmed to their own longest prompt and completion."""

    input_ids: Tensor  # [b, p + t]
    attention_mask: Tensor  # [b, p + t]
    position_ids: Tensor  # [b, p + t], counted from each row's first real token
    completion_ids: Tensor  # [b, t]
    temperature: Tensor  # [b], the sampler's: logits are divided by it


def model_inputs(
    prompt_ids: Tensor,
    prompt_lengths: Tensor,
    completion_ids: Tensor,
    completion_lengths: Tensor,
    temperature: Tensor,
) -> ModelInputs:
    """One forward's inputs from left-padded prompts and right-padded completions, trimmed to
    their own longest prompt and completion (the sampler and the update score rows alike)."""
    prompt_width = int(prompt_lengths.max())
    completion_width = int(completion_lengths.max())
    prompt_ids = prompt_ids[:, prompt_ids.shape[1] - prompt_width :]
    completion_ids = completion_ids[:, :completion_width]
    positions = torch.arange(prompt_width + completion_width, device=prompt_ids.device)
    first_real = prompt_width - prompt_lengths
    attention_mask = (positions[None, :] >= first_real[:, None]) & (
        positions[None, :] < (prompt_width + completion_lengths)[:, None]
    )
    position_ids = (positions[None, :] - first_real[:, None]).clamp(min=0)
    return ModelInputs(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=attention_mask.long(),
        position_ids=position_ids,
        completion_ids=completion_ids,
        temperature=temperature,
    )


def completion_logits(model: nn.Module, inputs: ModelInputs) -> Tensor:
    """``[b, t, V]`` float32 logits (divided by each row's sampling temperature) predicting each
    completion token.

    Prompts are left-padded and completions right-padded, so the completion occupies the last
    ``t`` columns and the hidden states at columns ``-t-1 .. -2`` predict it.
    """
    sequence_length = inputs.input_ids.shape[1]
    num_tokens = inputs.completion_ids.shape[1]
    # Indices rather than a trailing count: the logits come out contiguous, with no slice
    # (and no full-size zero-filled slice gradient) over the vocabulary dimension.
    keep = torch.arange(
        sequence_length - num_tokens - 1, sequence_length - 1, device=inputs.input_ids.device
    )
    outputs = model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        position_ids=inputs.position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    logits = outputs.logits.float()
    if bool((inputs.temperature == 1).all()):
        return logits
    return logits / inputs.temperature.to(logits)[:, None, None]


def completion_logprobs(logits: Tensor, completion_ids: Tensor) -> Tensor:
    """``[b, t]`` log-probability of each completion token (fused log-softmax + gather)."""
    flat = -F.cross_entropy(logits.flatten(0, 1), completion_ids.flatten(), reduction="none")
    return flat.view(completion_ids.shape)
