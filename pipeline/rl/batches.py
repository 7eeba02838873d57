"""Rollout rows (the Parquet contract) -> padded tensor batches for the update.

Layout: prompts left-padded, completions right-padded, so every completion starts at the same
column and the model's ``logits_to_keep`` covers exactly the completion. Masks come from the
stored lengths, never from pad ids (many tokenizers pad with EOS, which would mask the real EOS).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_args

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ..data.rows import TO_TRAIN, FinishReason
from ..logprobs import ModelInputs, model_inputs
from .algorithms import response_mask_from_lengths

FINISH_REASONS = get_args(FinishReason)


@dataclass(frozen=True)
class RolloutBatch:
    """Scored rollouts as tensors; row ``i`` of every field is the same completion."""

    prompt_ids: Tensor  # [B, P] left-padded
    prompt_lengths: Tensor  # [B]
    completion_ids: Tensor  # [B, T] right-padded
    completion_lengths: Tensor  # [B]
    # [B, T] float32: 1 where the model sampled the token, 0 for an episode's environment
    # tokens (its replies, the chat template's turns: context that carries no loss) and padding
    model_mask: Tensor
    sampling_logprobs: Tensor  # [B, T] float32, 0 on padding and environment tokens
    rewards: Tensor  # [B] float32
    group_ids: Tensor  # [B] int64, one id per prompt_id
    truncated: Tensor  # [B] bool, finish_reason == "length"
    temperatures: Tensor  # [B] float32, each row's sampling temperature
    # [B] float32 each: every numeric column of the rows (pass_fraction, reward_<term>, ...), so
    # an estimator or a loss that needs one more of them reads it without a change here
    columns: Mapping[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def response_mask(self) -> Tensor:
        """The tokens that train: the model's own, within each completion's length."""
        width = self.completion_ids.shape[1]
        return response_mask_from_lengths(self.completion_lengths, width) * self.model_mask

    def select(self, rows: Tensor) -> RolloutBatch:
        """The rows ``rows`` (index or bool mask), padding trimmed to their longest lengths."""
        picked: dict[str, Any] = {f.name: getattr(self, f.name)[rows] for f in _TENSORS}
        picked["columns"] = {name: column[rows] for name, column in self.columns.items()}
        if len(picked["rewards"]) == 0:
            return replace(self, **picked)
        prompt_width = int(picked["prompt_lengths"].max())
        completion_width = int(picked["completion_lengths"].max())
        picked["prompt_ids"] = picked["prompt_ids"][
            :, picked["prompt_ids"].shape[1] - prompt_width :
        ]
        for name in ("completion_ids", "model_mask", "sampling_logprobs"):
            picked[name] = picked[name][:, :completion_width]
        return RolloutBatch(**picked)

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in _TENSORS}
        columns = {name: column.to(device) for name, column in self.columns.items()}
        return RolloutBatch(**moved, columns=columns)

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


_TENSORS = [f for f in fields(RolloutBatch) if f.name != "columns"]


def _describe(row: Mapping[str, Any]) -> str:
    return f"row prompt_id={row.get('prompt_id')!r} group_index={row.get('group_index')!r}"


def collate_rollouts(rows: Iterable[Mapping[str, Any]], *, pad_token_id: int = 0) -> RolloutBatch:
    """Rows of the rollouts contract (dicts or a ``datasets.Dataset``) -> :class:`RolloutBatch`.

    ``pad_token_id`` only fills padding; nothing downstream reads it back.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("cannot collate an empty list of rollouts")
    seen: set[tuple[str, int]] = set()
    for row in rows:
        _check_row(row, seen)
    group_of: dict[str, int] = {}
    prompt_ids = [torch.tensor(row["prompt_ids"], dtype=torch.long) for row in rows]
    completion_ids = [torch.tensor(row["completion_ids"], dtype=torch.long) for row in rows]
    model_masks = [_model_mask(row) for row in rows]
    # vLLM can leave a logprob out (None): keep it as NaN, the mismatch metric skips NaN. An
    # environment token has none to keep: 0, as on padding.
    logprobs = [
        torch.tensor(
            [math.nan if lp is None else lp for lp in row["sampling_logprobs"]],
            dtype=torch.float32,
        ).where(mask != 0, 0.0)
        for row, mask in zip(rows, model_masks, strict=True)
    ]
    return RolloutBatch(
        prompt_ids=pad_sequence(
            prompt_ids, batch_first=True, padding_value=pad_token_id, padding_side="left"
        ),
        prompt_lengths=torch.tensor([len(p) for p in prompt_ids]),
        completion_ids=pad_sequence(completion_ids, batch_first=True, padding_value=pad_token_id),
        completion_lengths=torch.tensor([len(c) for c in completion_ids]),
        model_mask=pad_sequence(model_masks, batch_first=True, padding_value=0.0),
        sampling_logprobs=pad_sequence(logprobs, batch_first=True, padding_value=0.0),
        rewards=torch.tensor([float(row["reward"]) for row in rows], dtype=torch.float32),
        group_ids=torch.tensor(
            [group_of.setdefault(row["prompt_id"], len(group_of)) for row in rows],
            dtype=torch.long,
        ),
        truncated=torch.tensor(
            [row["finish_reason"] == "length" for row in rows], dtype=torch.bool
        ),
        temperatures=torch.tensor([float(row["temperature"]) for row in rows], dtype=torch.float32),
        columns=_numeric_columns(rows),
    )


def _check_row(row: Mapping[str, Any], seen: set[tuple[str, int]]) -> None:
    """Raise naming the row where it cannot train: a field missing, a duplicate, an empty
    prompt or completion, logprobs that do not fit, no finite reward, a greedy sample."""
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
    mask = row.get("model_mask")
    if mask is not None and (len(mask) != len(row["completion_ids"]) or not any(mask)):
        raise ValueError(
            f"{_describe(row)} has a model_mask of {len(mask)} values, {sum(mask)} of them "
            f"the model's, for {len(row['completion_ids'])} completion tokens"
        )
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


def _model_mask(row: Mapping[str, Any]) -> Tensor:
    """``[T]`` float32: which completion tokens the model sampled (all, in a single turn)."""
    mask = row.get("model_mask")
    if mask is None:
        return torch.ones(len(row["completion_ids"]), dtype=torch.float32)
    return torch.tensor(mask, dtype=torch.float32)


def _numeric_columns(rows: list[Mapping[str, Any]]) -> dict[str, Tensor]:
    """Every column that holds a number (or a bool) in every row, as ``[B]`` float32."""
    names = [
        name
        for name in rows[0]
        if all(isinstance(row.get(name), int | float) for row in rows)  # bool is an int
    ]
    return {
        name: torch.tensor([float(row[name]) for row in rows], dtype=torch.float32)
        for name in names
    }
