"""Sampling with plain transformers ``generate``: the rows of the rollouts contract, each
completion's logprobs recomputed in bounded forwards (the backend for machines without vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from transformers import StoppingCriteria, StoppingCriteriaList, TopPLogitsWarper

from ..data.prompts import Prompt
from ..data.rows import Completion, rollout_rows
from ..logprobs import completion_logits, completion_logprobs, model_inputs

HF_GENERATE_SAMPLER = "hf-generate"


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
    """Rollout rows (without ``reward``) of ``num_generations`` completions per prompt, drawn
    by :func:`generate_completions`: the transformers sampler for tests and machines without
    vLLM."""
    encoded = tokenizer([p.model_input for p in prompts], add_special_tokens=False)["input_ids"]
    groups = generate_completions(
        model, tokenizer, encoded, num_generations=num_generations,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        stop_strings=stop_strings, seed=seed, tokens_per_forward=tokens_per_forward,
    )  # fmt: skip
    return [
        row
        for prompt, ids, group in zip(prompts, encoded, groups, strict=True)
        for row in rollout_rows(
            prompt,
            ids,
            group,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new_tokens,
            sampler=HF_GENERATE_SAMPLER,
            sampler_weights=sampler_weights,
            policy_version=policy_version,
        )
    ]


@torch.no_grad()
def generate_completions(
    model: Any,
    tokenizer: Any,
    contexts: Sequence[Sequence[int]],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = (),
    seed: int | None = None,
    tokens_per_forward: int = 1024,
) -> list[list[Completion]]:
    """Sample ``num_generations`` completions of each context (token ids) with plain
    ``model.generate`` (``temperature=0``: greedy), then score them in forwards of
    ``tokens_per_forward`` completion tokens (:func:`sampled_logprobs`): ``generate`` keeps no
    per-step scores, so memory does not grow with steps x vocabulary."""
    if num_generations < 1 or max_new_tokens < 1:
        raise ValueError("num_generations and max_new_tokens must be >= 1")
    padded, attention = _left_padded(
        [list(ids) for ids in contexts], tokenizer, next(model.parameters()).device
    )
    padded = padded.repeat_interleave(num_generations, dim=0)
    prompt_lengths = attention.sum(-1).repeat_interleave(num_generations)
    was_training = model.training
    model.eval()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        generated = model.generate(
            input_ids=padded,
            attention_mask=attention.repeat_interleave(num_generations, dim=0),
            **_sampling(temperature, top_p),
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=_pad_id(tokenizer),
            stopping_criteria=StoppingCriteriaList(
                [StopStrings(tokenizer, stop_strings, padded.shape[1])] if stop_strings else []
            ),
            return_dict_in_generate=False,  # the token ids only: no per-step scores kept
        )[:, padded.shape[1] :]
        lengths, stopped = stopped_lengths(tokenizer, generated, stop_strings)
        logprobs = sampled_logprobs(
            model, padded, prompt_lengths, generated, lengths,
            temperature=temperature, top_p=top_p, tokens_per_forward=tokens_per_forward,
        )  # fmt: skip
    finally:
        model.train(was_training)
    completions = _completions(tokenizer, generated, lengths, stopped, logprobs, stop_strings)
    return [
        completions[index * num_generations : (index + 1) * num_generations]
        for index in range(len(contexts))
    ]


class StopStrings(StoppingCriteria):
    """Ends a row once its completion's text holds one of ``stops``: the text as
    :func:`stopped_lengths` reads it (each token decoded on its own), one token a step, and only
    the last characters that could start a stop kept. transformers' own ``stop_strings`` first
    matches every stop against every token of the vocabulary: 16 stops of 128 characters cost
    69 s and 372 MB for SmolLM2's 49,152 tokens, and it keeps the last 8 sets."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_length: int) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.keep = max(map(len, self.stops)) - 1  # characters a stop may begin in
        self.read = prompt_length  # the ids read so far
        self.tails: list[str] = []

    def __call__(self, input_ids: Tensor, scores: Tensor | None, **kwargs: Any) -> Tensor:
        new = input_ids[:, self.read :].tolist()
        self.read = input_ids.shape[1]
        self.tails = self.tails or [""] * len(new)
        done = []
        for row, ids in enumerate(new):
            text = self.tails[row] + "".join(self.tokenizer.decode([i]) for i in ids)
            self.tails[row] = text[-self.keep :] if self.keep else ""
            done.append(any(stop in text for stop in self.stops))
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def stopped_lengths(
    tokenizer: Any, generated: Tensor, stop_strings: Sequence[str]
) -> tuple[Tensor, Tensor]:
    """Each row's length and whether it stopped: through its first EOS (a token the policy
    chose) or the token that completes a stop string, whichever comes first. Rows that
    ``generate`` stopped early are padded after that point, with ids the policy never chose."""
    is_eos = generated == tokenizer.eos_token_id
    stopped = is_eos.any(dim=1)
    lengths = torch.where(stopped, is_eos.int().argmax(dim=1) + 1, generated.shape[1])
    if stop_strings:
        for row, ids in enumerate(generated.tolist()):
            text = ""
            for index, token in enumerate(ids[: int(lengths[row])]):
                text += tokenizer.decode([token])
                if any(stop in text for stop in stop_strings):
                    lengths[row], stopped[row] = index + 1, True
                    break
    return lengths, stopped


def cut_after_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` through the first stop string in it (vLLM's text with
    ``include_stop_str_in_output``: the last token may run past the stop string)."""
    ends = [text.find(stop) + len(stop) for stop in stop_strings if stop in text]
    return text[: min(ends)] if ends else text


def _completions(
    tokenizer: Any,
    generated: Tensor,
    lengths: Tensor,
    stopped: Tensor,
    logprobs: list[list[float]],
    stop_strings: Sequence[str],
) -> list[Completion]:
    """Each generated row cut at its length, decoded, with its logprobs and finish reason."""
    rows = [row[:n] for row, n in zip(generated.tolist(), lengths.tolist(), strict=True)]
    return [
        Completion(
            text=cut_after_stop(tokenizer.decode(ids, skip_special_tokens=True), stop_strings),
            token_ids=ids,
            logprobs=row_logprobs,
            finish_reason="stop" if is_stop else "length",
        )
        for ids, row_logprobs, is_stop in zip(rows, logprobs, stopped.tolist(), strict=True)
    ]


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _left_padded(
    encoded: list[list[int]], tokenizer: Any, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The prompts left-padded, and their attention mask."""
    padded = pad_sequence(
        [torch.tensor(ids, dtype=torch.long) for ids in encoded],
        batch_first=True,
        padding_value=_pad_id(tokenizer),
        padding_side="left",
    ).to(device)
    lengths = torch.tensor([len(ids) for ids in encoded], device=device)
    positions = torch.arange(padded.shape[1], device=device)[None, :]
    return padded, (positions >= (padded.shape[1] - lengths)[:, None]).long()


def _sampling(temperature: float, top_p: float) -> dict[str, Any]:
    """``generate``'s sampling arguments: greedy at temperature 0, else pure temperature and
    top-p sampling (top-k off, as vLLM samples)."""
    if temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": top_p}
    return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
