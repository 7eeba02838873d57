"""Rollout rows (the Parquet contract) <-> padded tensor batches for the update, and the
transformers sampler that makes such rows.

Layout: prompts left-padded, completions right-padded, so every completion starts at the same
column and the model's ``logits_to_keep`` covers exactly the completion. Masks come from the
stored lengths, never from pad ids (many tokenizers pad with EOS, which would mask the real EOS).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple, get_args

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from transformers import TopPLogitsWarper

from ..data.prompts import Prompt
from ..data.rows import TO_TRAIN, FinishReason, RolloutRow
from .algorithms import response_mask_from_lengths
from .models import completion_logits, completion_logprobs

FINISH_REASONS = get_args(FinishReason)
HF_GENERATE_SAMPLER = "hf-generate"


@dataclass(frozen=True)
class ModelInputs:
    """One forward's worth of rows, trimmed to their own longest prompt and completion."""

    input_ids: Tensor  # [b, p + t]
    attention_mask: Tensor  # [b, p + t]
    position_ids: Tensor  # [b, p + t], counted from each row's first real token
    completion_ids: Tensor  # [b, t]
    temperature: Tensor  # [b], the sampler's: logits are divided by it


@dataclass(frozen=True)
class RolloutBatch:
    """Scored rollouts as tensors; row ``i`` of every field is the same completion."""

    prompt_ids: Tensor  # [B, P] left-padded
    prompt_lengths: Tensor  # [B]
    completion_ids: Tensor  # [B, T] right-padded
    completion_lengths: Tensor  # [B]
    sampling_logprobs: Tensor  # [B, T] float32, 0 on padding
    rewards: Tensor  # [B] float32
    group_ids: Tensor  # [B] int64, one id per prompt_id
    truncated: Tensor  # [B] bool, finish_reason == "length"
    temperatures: Tensor  # [B] float32, each row's sampling temperature

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def response_mask(self) -> Tensor:
        return response_mask_from_lengths(self.completion_lengths, self.completion_ids.shape[1])

    def select(self, rows: Tensor) -> RolloutBatch:
        """The rows ``rows`` (index or bool mask), padding trimmed to their longest lengths."""
        picked = {f.name: getattr(self, f.name)[rows] for f in fields(self)}
        if len(picked["rewards"]) == 0:
            return replace(self, **picked)
        prompt_width = int(picked["prompt_lengths"].max())
        completion_width = int(picked["completion_lengths"].max())
        picked["prompt_ids"] = picked["prompt_ids"][
            :, picked["prompt_ids"].shape[1] - prompt_width :
        ]
        picked["completion_ids"] = picked["completion_ids"][:, :completion_width]
        picked["sampling_logprobs"] = picked["sampling_logprobs"][:, :completion_width]
        return RolloutBatch(**picked)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def model_inputs(self, rows: Tensor) -> ModelInputs:
        """Inputs for rows ``rows``; the completion keeps the batch width ``T`` only if a row
        needs it, so short micro-batches cost short forwards."""
        return model_inputs(
            self.prompt_ids[rows],
            self.prompt_lengths[rows],
            self.completion_ids[rows],
            self.completion_lengths[rows],
            self.temperatures[rows],
        )


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


def _describe(row: Mapping[str, Any]) -> str:
    return f"row prompt_id={row.get('prompt_id')!r} group_index={row.get('group_index')!r}"


def collate_rollouts(rows: Iterable[Mapping[str, Any]], *, pad_token_id: int = 0) -> RolloutBatch:
    """Rows of the rollouts contract (dicts or a ``datasets.Dataset``) -> :class:`RolloutBatch`.

    ``pad_token_id`` only fills padding; nothing downstream reads it back.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("cannot collate an empty list of rollouts")
    group_of: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    prompt_ids, completion_ids, logprobs = [], [], []
    rewards, group_ids, truncated, temperatures = [], [], [], []
    for row in rows:
        missing = [name for name in TO_TRAIN if name not in row]
        if missing:
            raise ValueError(f"{_describe(row)} lacks required fields {missing}")
        key = (row["prompt_id"], row["group_index"])
        if key in seen:
            raise ValueError(f"duplicate {_describe(row)}")
        seen.add(key)
        if not row["prompt_ids"]:
            raise ValueError(f"{_describe(row)} has an empty prompt")
        if not row["completion_ids"]:
            raise ValueError(f"{_describe(row)} has an empty completion (no token to score)")
        if len(row["sampling_logprobs"]) != len(row["completion_ids"]):
            raise ValueError(
                f"{_describe(row)} has {len(row['sampling_logprobs'])} sampling_logprobs for "
                f"{len(row['completion_ids'])} completion tokens"
            )
        if row["finish_reason"] not in FINISH_REASONS:
            raise ValueError(
                f"{_describe(row)} has finish_reason {row['finish_reason']!r}; "
                f"expected one of {list(FINISH_REASONS)}"
            )
        reward = row["reward"]
        if reward is None or not math.isfinite(reward):
            raise ValueError(f"{_describe(row)} has a non-finite reward {reward!r}")
        temperature = row["temperature"]
        if temperature is None or not 0 < temperature < math.inf:
            raise ValueError(
                f"{_describe(row)} has temperature {temperature!r}: only sampled rows (> 0) "
                "train; greedy ones have no sampling distribution"
            )
        prompt_ids.append(torch.tensor(row["prompt_ids"], dtype=torch.long))
        completion_ids.append(torch.tensor(row["completion_ids"], dtype=torch.long))
        # vLLM can leave a logprob out (None): keep it as NaN, the mismatch metric skips NaN.
        logprobs.append(
            torch.tensor(
                [math.nan if lp is None else lp for lp in row["sampling_logprobs"]],
                dtype=torch.float32,
            )
        )
        rewards.append(float(reward))
        group_ids.append(group_of.setdefault(row["prompt_id"], len(group_of)))
        truncated.append(row["finish_reason"] == "length")
        temperatures.append(float(temperature))
    return RolloutBatch(
        prompt_ids=pad_sequence(
            prompt_ids, batch_first=True, padding_value=pad_token_id, padding_side="left"
        ),
        prompt_lengths=torch.tensor([len(p) for p in prompt_ids]),
        completion_ids=pad_sequence(completion_ids, batch_first=True, padding_value=pad_token_id),
        completion_lengths=torch.tensor([len(c) for c in completion_ids]),
        sampling_logprobs=pad_sequence(logprobs, batch_first=True, padding_value=0.0),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        truncated=torch.tensor(truncated, dtype=torch.bool),
        temperatures=torch.tensor(temperatures, dtype=torch.float32),
    )


class Completion(NamedTuple):
    """One sampled completion as a sampler reports it."""

    text: str
    token_ids: list[int]
    logprobs: Sequence[float | None]  # of the distribution sampled from; vLLM may leave one out
    finish_reason: str  # one of FINISH_REASONS


def rollout_rows(
    prompt: Prompt,
    prompt_ids: list[int],
    completions: Sequence[Completion],
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    sampler: str,
    sampler_weights: str,
    policy_version: int,
) -> list[dict[str, Any]]:
    """Rollout rows (the Parquet contract, without ``reward``) for one prompt's group: every
    sampler builds its rows here."""
    return [
        RolloutRow(
            prompt_id=prompt.task_id,
            group_index=index,
            prompt=prompt.text,
            completion=completion.text,
            prompt_ids=prompt_ids,
            completion_ids=completion.token_ids,
            sampling_logprobs=completion.logprobs,
            finish_reason=completion.finish_reason,
            completion_style=prompt.completion_style,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            sampler=sampler,
            sampler_weights=sampler_weights,
            policy_version=policy_version,
        ).model_dump()
        for index, completion in enumerate(completions)
    ]


@torch.no_grad()
def sampled_logprobs(
    model: Any,
    prompt_ids: Tensor,
    prompt_lengths: Tensor,
    completion_ids: Tensor,
    completion_lengths: Tensor,
    *,
    temperature: float,
    top_p: float,
    tokens_per_forward: int,
) -> list[list[float]]:
    """Each completion's logprobs under the distribution it was drawn from, from forwards over
    prompt + completion: logits divided by the temperature, then top-p renormalised, as
    ``generate``'s warpers and vLLM's ``processed_logprobs`` do (greedy: the plain logits).

    Rows go ``tokens_per_forward // T`` at a time, so only one forward's ``[rows, T, V]``
    logits exist at once, whatever the number of rows.
    """
    greedy = temperature == 0
    top_p_warper = TopPLogitsWarper(top_p) if top_p < 1 and not greedy else None
    temperatures = torch.full(
        prompt_lengths.shape, 1.0 if greedy else temperature, device=prompt_ids.device
    )
    per_forward = max(1, tokens_per_forward // completion_ids.shape[1])
    logprobs: list[list[float]] = []
    for rows in torch.arange(len(prompt_ids), device=prompt_ids.device).split(per_forward):
        inputs = model_inputs(
            prompt_ids[rows],
            prompt_lengths[rows],
            completion_ids[rows],
            completion_lengths[rows],
            temperatures[rows],
        )
        logits = completion_logits(model, inputs)
        if top_p_warper is not None:
            sampled = inputs.completion_ids[..., None]
            # The warper reads only the scores, [rows * T, V] here.
            nucleus = top_p_warper(inputs.input_ids, logits.flatten(0, 1)).view_as(logits)
            # The sampled token was inside the nucleus when drawn: keep it there even when a
            # rounding difference of the recomputed logits puts it just outside.
            logits = nucleus.scatter(-1, sampled, logits.gather(-1, sampled))
        chunk = completion_logprobs(logits, inputs.completion_ids)
        lengths = completion_lengths[rows].tolist()
        logprobs += [row[:n].tolist() for row, n in zip(chunk, lengths, strict=True)]
    return logprobs


@torch.no_grad()
def generate_rollouts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = (),
    seed: int | None = None,
    policy_version: int = 0,
    sampler_weights: str = "",
    tokens_per_forward: int = 1024,
) -> list[dict[str, Any]]:
    """Sample ``num_generations`` completions per prompt with plain ``model.generate``
    (``temperature=0``: greedy), then score them in forwards of ``tokens_per_forward``
    completion tokens (:func:`sampled_logprobs`).

    The transformers sampler for tests and machines without vLLM: ``generate`` keeps no
    per-step scores, so memory does not grow with steps x vocabulary. Rows follow the rollouts
    contract without ``reward``.
    """
    if num_generations < 1 or max_new_tokens < 1:
        raise ValueError("num_generations and max_new_tokens must be >= 1")
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    encoded = tokenizer([p.text for p in prompts], add_special_tokens=False)["input_ids"]
    device = next(model.parameters()).device
    padded = pad_sequence(
        [torch.tensor(ids, dtype=torch.long) for ids in encoded],
        batch_first=True,
        padding_value=pad_id,
        padding_side="left",
    ).to(device)
    prompt_lengths = torch.tensor([len(ids) for ids in encoded], device=device)
    attention = (
        torch.arange(padded.shape[1], device=device)[None, :]
        >= (padded.shape[1] - prompt_lengths)[:, None]
    ).long()
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    )
    padded = padded.repeat_interleave(num_generations, dim=0)
    prompt_lengths = prompt_lengths.repeat_interleave(num_generations)
    was_training = model.training
    model.eval()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=padded,
            attention_mask=attention.repeat_interleave(num_generations, dim=0),
            **sampling,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            stop_strings=list(stop_strings) or None,
            tokenizer=tokenizer if stop_strings else None,
            return_dict_in_generate=False,  # the token ids only: no per-step scores kept
        )
        generated = sequences[:, padded.shape[1] :]
        is_eos = generated == eos_id
        stopped = is_eos.any(dim=1)
        # Length up to and including the first EOS; the EOS itself is a token the policy chose.
        lengths = torch.where(stopped, is_eos.int().argmax(dim=1) + 1, generated.shape[1])
        logprobs = sampled_logprobs(
            model,
            padded,
            prompt_lengths,
            generated,
            lengths,
            temperature=temperature,
            top_p=top_p,
            tokens_per_forward=tokens_per_forward,
        )
    finally:
        model.train(was_training)
    completions = [
        Completion(
            text=tokenizer.decode(ids, skip_special_tokens=True),
            token_ids=ids,
            logprobs=row_logprobs,
            finish_reason="stop" if is_stop else "length",
        )
        for ids, row_logprobs, is_stop in zip(
            [row[:n] for row, n in zip(generated.tolist(), lengths.tolist(), strict=True)],
            logprobs,
            stopped.tolist(),
            strict=True,
        )
    ]
    return [
        row
        for index, prompt in enumerate(prompts)
        for row in rollout_rows(
            prompt,
            encoded[index],
            completions[index * num_generations : (index + 1) * num_generations],
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new_tokens,
            sampler=HF_GENERATE_SAMPLER,
            sampler_weights=sampler_weights,
            policy_version=policy_version,
        )
    ]
