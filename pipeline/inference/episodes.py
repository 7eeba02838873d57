"""Episodes: a problem answered over several turns, each answer run against the problem's
public tests by an environment whose reply is the next user turn (RL from execution
feedback, Gehring et al. 2024).

:class:`EpisodeSampler` is a sampler whose rows are episodes, so every stage that samples
(RL with dynamic sampling, evaluation, rollouts) runs them unchanged. All episodes of a batch
advance a turn at a time: turn 1 is today's prompt and group (``num_generations``
completions of it); each later turn continues every unfinished episode once, after the
environment replied to all of a turn's answers together (one round on the sandbox pool).

An episode is one row. Its ``completion_ids`` are every token after the prompt, in the order
the model read them: its answers, and between them the environment's turns, rendered by the
tokenizer's chat template (the end of the assistant's turn, the user turn with the reply, the
next assistant turn's start and its answer prefix). ``model_mask`` marks the model's own
tokens: only they carry loss and KL, the environment's are context. Token ids are never
re-tokenized from text: the engine continues exactly the ids the trainer scores.
``completion`` is the final answer (what scoring judges against every test); ``answers`` holds
each turn's. With ``max_turns: 1`` a row is the single-turn row, with a mask of ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...verifiers import Problem
from ...verifiers.environments import Environment, Episode
from ..data.prompts import Prompt
from ..data.rows import Completion, Context, EpisodeEnd, rollout_rows
from .sampling import EngineConfig, Sampler, SamplingConfig, stop_strings

# Stands in for an answer while the chat template renders what follows it.
_ANSWER = "\u2063codepost-answer\u2063"


class EpisodeConfig(BaseModel):
    """How an episode runs: its environment, its turns and its token budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    environment: str = Field(
        "execution-feedback", description="a registered environment (verifiers/environments)"
    )
    max_turns: int = Field(
        1, ge=1, le=16, description="answers per episode; 1 = single turn, as without episodes"
    )
    max_episode_tokens: int = Field(
        2048,
        ge=64,
        description="the prompt and every turn together; a turn that would not fit (its reply "
        "and max_tokens) ends the episode (episode_end: budget)",
    )


def check_episodes(config: EpisodeConfig, prompt_style: str, engine: EngineConfig) -> None:
    """Refuse episodes a run could not sample, before it starts."""
    if config.max_turns > 1 and prompt_style == "continuation":
        raise ValueError(
            f"episodes.max_turns={config.max_turns} needs a chat prompt style (the environment "
            "replies in a user turn): prompt_style 'chat' or 'chat-free'"
        )
    if config.max_turns > 1 and config.max_episode_tokens > engine.max_model_len:
        raise ValueError(
            f"episodes.max_episode_tokens={config.max_episode_tokens} is more than the engine's "
            f"context holds (engine.max_model_len={engine.max_model_len}): lower it or raise "
            "engine.max_model_len"
        )


def reply_turn(tokenizer: Any, observation: str, answer_prefix: str) -> str:
    """What the chat template puts after an answer for the environment's ``observation``: the
    end of the assistant's turn, the user turn, the next assistant turn's start, then the
    answer prefix the prompt opened its answer with."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("episodes of more than one turn need a tokenizer with a chat template")
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": _ANSWER},
            {"role": "user", "content": observation},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    return text[text.index(_ANSWER) + len(_ANSWER) :] + answer_prefix


@dataclass
class _Running:
    """One episode's tokens so far, beside the environment's own :class:`Episode`."""

    prompt: Prompt
    prompt_ids: list[int]
    episode: Episode
    completion_ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    finish_reason: str = "stop"
    end: EpisodeEnd | None = None

    def answered(self, completion: Completion) -> None:
        self.completion_ids += completion.token_ids
        self.model_mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        self.answers.append(self.prompt.answer_prefix + completion.text)
        self.finish_reason = completion.finish_reason

    def replied(self, observation: str, ids: list[int]) -> None:
        if self.completion_ids and ids and self.completion_ids[-1] == ids[0]:
            ids = ids[1:]  # the answer ended with the end of its turn (EOS): not twice
        self.completion_ids += ids
        self.model_mask += [0] * len(ids)
        self.logprobs += [None] * len(ids)
        self.observations.append(observation)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


class EpisodeSampler:
    """A :class:`~.sampling.Sampler` whose rows are episodes of ``environment``: it samples
    through ``sampler`` (refreshes and probes go there too) and reads ``problems`` by the
    prompts' task ids."""

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: Any,
        problems: Mapping[str, Problem],
        environment: Environment,
        config: EpisodeConfig,
    ) -> None:
        self.sampler, self.tokenizer = sampler, tokenizer
        self.problems, self.environment, self.config = problems, environment, config

    @property
    def name(self) -> str:
        return self.sampler.name

    @property
    def weights(self) -> str:
        return self.sampler.weights

    def complete(
        self, contexts: Sequence[Context], config: SamplingConfig
    ) -> list[list[Completion]]:
        return self.sampler.complete(contexts, config)

    def refresh(self, checkpoint: Any, expected_probe: list[float] | None = None) -> float:
        return self.sampler.refresh(checkpoint, expected_probe)

    def probe_logprobs(self) -> list[float]:
        return self.sampler.probe_logprobs()

    def sample(
        self, prompts: Sequence[Prompt], config: SamplingConfig, *, policy_version: int = 0
    ) -> list[dict[str, Any]]:
        """``config.num_generations`` episodes of each prompt, as rollout rows."""
        running = self._first_turn(prompts, config)
        for _ in range(1, self.config.max_turns):
            active = [r for r in running if r.end is None]
            if not active:
                break
            replies = self.environment.feedback(
                [r.episode for r in active], [r.answers[-1] for r in active]
            )
            going: list[_Running] = []
            for run, reply in zip(active, replies, strict=True):
                if reply.done or reply.observation is None:
                    run.end = reply.info.get("end", "passed")
                    continue
                text = reply_turn(self.tokenizer, reply.observation, run.prompt.answer_prefix)
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if len(run.context) + len(ids) + config.max_tokens > self.config.max_episode_tokens:
                    run.end = "budget"
                    continue
                run.replied(reply.observation, ids)
                going.append(run)
            contexts = [Context(r.context, stop_strings(config, [r.prompt])) for r in going]
            one_each = config.model_copy(update={"num_generations": 1})
            for run, (completion,) in zip(
                going, self.sampler.complete(contexts, one_each) if going else [], strict=True
            ):
                run.answered(completion)
        for run in running:
            run.end = run.end or "turns"
        return [self._row(run, index, config, policy_version) for index, run in _indexed(running)]

    def _first_turn(self, prompts: Sequence[Prompt], config: SamplingConfig) -> list[_Running]:
        """Every episode after its first answer: the prompts' groups, as a single turn."""
        encoded = [self.tokenizer.encode(p.model_input, add_special_tokens=False) for p in prompts]
        groups = self.sampler.complete(
            [
                Context(ids, stop_strings(config, [p]))
                for p, ids in zip(prompts, encoded, strict=True)
            ],
            config,
        )
        running = []
        for prompt, ids, group in zip(prompts, encoded, groups, strict=True):
            for completion in group:
                run = _Running(prompt, ids, self.environment.reset(self.problems[prompt.task_id]))
                run.answered(completion)
                running.append(run)
        return running

    def _row(
        self, run: _Running, index: int, config: SamplingConfig, policy_version: int
    ) -> dict[str, Any]:
        final = run.answers[-1].removeprefix(run.prompt.answer_prefix)
        (row,) = rollout_rows(
            run.prompt,
            run.prompt_ids,
            [Completion(final, run.completion_ids, run.logprobs, run.finish_reason)],
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
            sampler=self.name,
            sampler_weights=self.weights,
            policy_version=policy_version,
        )
        return {
            **row,
            "group_index": index,
            "model_mask": run.model_mask,
            "turns": len(run.answers),
            "answers": run.answers,
            "observations": run.observations,
            "episode_end": run.end,
        }


def _indexed(running: list[_Running]) -> list[tuple[int, _Running]]:
    """Each episode with its index in its prompt's group."""
    seen: dict[str, int] = {}
    indexed = []
    for run in running:
        index = seen.get(run.prompt.task_id, 0)
        seen[run.prompt.task_id] = index + 1
        indexed.append((index, run))
    return indexed
