"""Reward models: a scalar head on a causal LM (``AutoModelForSequenceClassification`` with one
label) that the reward-model stage trains on the verifier's pass/fail pairs. Here they score
completions, read exactly as TRL's ``RewardTrainer`` read them in training: the prompt's text,
the completion's, and the end-of-sequence token, tokenized together; the score is the head's
output at the last token that is not padding.

A learned reward term (:class:`LearnedReward`) is where a reward model enters RL. The verifier's
terms are pure functions of a completion (``verifiers.rewards``), and the verifier may not load
a model; so a learned term is applied by the pipeline after the verifier has scored the rows
(:func:`add_learned_rewards`, called by the scoring stage): it adds the column
``reward_<name>`` and adds ``weight x score`` to ``reward``. RL, the rollouts stage and the
evaluation read those columns as they read the verifier's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..settings.walk import OutsideInput
from .checkpoints.manifest import MANIFEST, path_digests, read_manifest
from .data.rows import REWARD_COMPONENT_PREFIX
from .model_config import ModelNotFoundError, resolve_model, safetensors_only

if TYPE_CHECKING:  # torch and transformers load with a reward model, not with its settings
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def reward_input_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str) -> list[int]:
    """The tokens a reward model reads for one completion, as ``RewardTrainer`` builds them:
    prompt and completion as one text, the end-of-sequence token added unless it ends so."""
    text = prompt + completion
    if not text.endswith(tokenizer.eos_token):
        text += tokenizer.eos_token
    ids: list[int] = tokenizer(text=text)["input_ids"]
    return ids


class RewardModelScorer:
    """A reward model and its tokenizer, scoring (prompt, completion) texts in batches.

    Texts longer than ``max_length`` tokens keep their last ``max_length``: the score is read at
    the end, so the end is what must stay (training dropped such pairs instead)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_length: int
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_token_id = tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = tokenizer.eos_token_id
        # Where the head reads: the last token that is not padding (RewardTrainer sets it too).
        model.config.get_text_config().pad_token_id = self.pad_token_id

    @classmethod
    def load(cls, path: str) -> RewardModelScorer:
        """The reward model published in ``path`` (plain ``transformers`` loads it), with the
        ``max_length`` it trained at when the reward-model stage published it."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        source = resolve_model(path)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                source, use_safetensors=True if safetensors_only(source) else None
            )
            tokenizer = AutoTokenizer.from_pretrained(source)
        except OSError as exc:
            raise ModelNotFoundError(f"reward model {path!r}: {exc}") from exc
        if model.config.num_labels != 1:
            raise ValueError(
                f"reward model {path}: {model.config.num_labels} labels, a reward model has 1"
            )
        max_length = model.config.max_position_embeddings
        if (Path(source) / MANIFEST).is_file():
            trained = read_manifest(Path(source)).config.get("training", {})
            max_length = trained.get("max_length", max_length)
        return cls(model.eval(), tokenizer, max_length)

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], batch_size: int = 8
    ) -> list[float]:
        """One score per (prompt, completion), in order; batches right-padded."""
        import torch

        pad = self.pad_token_id
        encoded = [
            reward_input_ids(self.tokenizer, prompt, completion)[-self.max_length :]
            for prompt, completion in zip(prompts, completions, strict=True)
        ]
        scores: list[float] = []
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for ids in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, tokens in enumerate(chunk):
                ids[row, : len(tokens)] = torch.tensor(tokens)
                mask[row, : len(tokens)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask).logits
            scores += logits[:, 0].float().tolist()
        return scores


def trained_problems(reward_model: str) -> set[str]:
    """The problems (task ids) a reward model published by the reward-model stage trained on;
    none for a model without that record."""
    path = Path(reward_model).expanduser()
    if not (path / MANIFEST).is_file():
        return set()
    return set(read_manifest(path).metrics.get("train_problems", []))


_LOADED: dict[str, RewardModelScorer] = {}
_LOADED_LOCK = threading.Lock()


def reward_model_scorer(path: str) -> RewardModelScorer:
    """The process-wide scorer of the reward model in ``path`` (loaded once: RL scores every
    iteration with it)."""
    with _LOADED_LOCK:
        if path not in _LOADED:
            _LOADED[path] = RewardModelScorer.load(path)
        return _LOADED[path]


class RewardModelSettings(BaseModel, OutsideInput):
    """A reward model a stage scores with: its folder, and how many completions a forward pass
    takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reward_model: str = Field(
        min_length=1, description="a reward model's folder (the reward-model stage's output)"
    )
    batch_size: int = Field(8, ge=1, le=1024, description="completions per forward pass")

    def content_digests(self) -> dict[str, str]:
        """The reward model's files: weights replaced under the same path are another input."""
        path = Path(self.reward_model).expanduser()
        if not path.is_dir():
            raise ModelNotFoundError(f"reward model {self.reward_model!r}: no such folder")
        return path_digests(f"reward model {self.reward_model}", path)

    def score(self, rows: Sequence[Mapping[str, Any]]) -> list[float]:
        """The model's score of each row's completion of its prompt."""
        return reward_model_scorer(self.reward_model).score(
            [row["prompt"] for row in rows], [row["completion"] for row in rows], self.batch_size
        )


class LearnedReward(RewardModelSettings):
    """A reward term a reward model gives: its score of each completion, times ``weight``."""

    weight: float = Field(1.0, description="added to reward: weight x the model's score")


def add_learned_rewards(
    rows: Sequence[Mapping[str, Any]], learned: Mapping[str, LearnedReward]
) -> list[dict[str, Any]]:
    """``rows`` (scored by the verifier) with each learned term's column ``reward_<name>`` and
    ``reward`` raised by its weighted score. Rows the verifier left out (``excluded``: a sandbox
    error) keep their NaN reward and get NaN scores."""
    out = [dict(row) for row in rows]
    kept = [row for row in out if not row["excluded"]]
    for name, term in learned.items():
        scores = term.score(kept)
        column = f"{REWARD_COMPONENT_PREFIX}{name}"
        for row in out:
            row[column] = math.nan
        for row, score in zip(kept, scores, strict=True):
            row[column] = score
            row["reward"] += term.weight * score
    return out
