"""Rollout rows (the Parquet contract) <-> padded tensor batches for the update.

Layout: prompts left-padded, completions right-padded, so every completion starts at the same
column and the model's ``logits_to_keep`` covers exactly the completion. Masks come from the
stored lengths, never from pad ids (many tokenizers pad with EOS, which would mask the real EOS).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, get_args

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ..data.rows import TO_TRAIN, FinishReason, RolloutRow
from .algorithms import response_mask_from_lengths

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
        prompt_lengths = self.prompt_lengths[rows]
        completion_lengths = self.completion_lengths[rows]
        prompt_width = int(prompt_lengths.max())
        completion_width = int(completion_lengths.max())
        prompt_ids = self.prompt_ids[rows, self.prompt_ids.shape[1] - prompt_width :]
        completion_ids = self.completion_ids[rows, :completion_width]
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
            temperature=self.temperatures[rows],
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


@torch.no_grad()
def generate_rollouts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = (),
    seed: int | None = None,
    prompt_ids: Sequence[str] | None = None,
    policy_version: int = 0,
) -> list[dict[str, Any]]:
    """Sample ``num_generations`` completions per prompt with ``model.generate``
    (``temperature=0``: greedy).

    The reference sampler for tests and small runs (vLLM is the production one): rows of the
    rollouts contract (:class:`RolloutRow`, code found as ``completion_style="auto"``).
    Sampling logprobs are those of the distribution actually sampled from (temperature and
    top-p applied, no top-k).
    """
    if num_generations < 1 or max_new_tokens < 1:
        raise ValueError("num_generations and max_new_tokens must be >= 1")
    prompt_ids = (
        list(prompt_ids) if prompt_ids is not None else [str(i) for i in range(len(prompts))]
    )
    if len(prompt_ids) != len(prompts):
        raise ValueError(f"{len(prompt_ids)} prompt_ids for {len(prompts)} prompts")
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    device = next(model.parameters()).device
    prompt_tensors = [torch.tensor(ids, dtype=torch.long) for ids in encoded]
    padded = pad_sequence(
        prompt_tensors, batch_first=True, padding_value=pad_id, padding_side="left"
    ).to(device)
    lengths = torch.tensor([len(ids) for ids in encoded], device=device)
    attention = (
        torch.arange(padded.shape[1], device=device)[None, :]
        >= (padded.shape[1] - lengths)[:, None]
    ).long()
    was_training = model.training
    model.eval()
    if seed is not None:
        torch.manual_seed(seed)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    )
    output = model.generate(
        input_ids=padded.repeat_interleave(num_generations, dim=0),
        attention_mask=attention.repeat_interleave(num_generations, dim=0),
        **sampling,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        stop_strings=list(stop_strings) or None,
        tokenizer=tokenizer if stop_strings else None,
        output_scores=True,
        return_dict_in_generate=True,
    )
    model.train(was_training)
    generated = output.sequences[:, padded.shape[1] :]
    # `scores` are the processed logits the sampler drew from (temperature already applied).
    logprobs = torch.stack(output.scores, dim=1).float().log_softmax(-1)
    logprobs = logprobs.gather(-1, generated[:, :, None]).squeeze(-1)
    is_eos = generated == eos_id
    stopped = is_eos.any(dim=1)
    # Length up to and including the first EOS; the EOS itself is a token the policy chose.
    lengths_out = torch.where(stopped, is_eos.int().argmax(dim=1) + 1, generated.shape[1])
    rows = []
    for i in range(generated.shape[0]):
        prompt_index, group_index = divmod(i, num_generations)
        ids = generated[i, : lengths_out[i]].tolist()
        rows.append(
            RolloutRow(
                prompt_id=prompt_ids[prompt_index],
                group_index=group_index,
                prompt=prompts[prompt_index],
                completion=tokenizer.decode(ids, skip_special_tokens=True),
                prompt_ids=encoded[prompt_index],
                completion_ids=ids,
                sampling_logprobs=logprobs[i, : lengths_out[i]].tolist(),
                finish_reason="stop" if stopped[i] else "length",
                completion_style="auto",
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                sampler=HF_GENERATE_SAMPLER,
                policy_version=policy_version,
            ).model_dump()
        )
    return rows
