"""The verifier's rewards as TRL ``reward_funcs``.

TRL 1.16 (``GRPOTrainer._calculate_rewards``) calls every reward function with keyword
arguments only: ``prompts``, ``completions`` (strings, or message lists for conversational
data), ``completion_ids``, each dataset column except prompt/completion as a list (so a
``task_id`` column arrives as ``task_id``), and ``trainer_state``, ``log_extra``,
``log_metric``. A function whose ``__call__`` is async is awaited on TRL's event loop, in
parallel with the other async ones. ``None`` means "no reward" (TRL turns it into NaN).

``make_trl_reward_funcs`` returns one function per weighted component, each scaled by its
weight: with TRL's default ``reward_weights`` (all 1) they sum to the verifier's reward, and
TRL logs each component on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .extraction import MAX_COMPLETION_CHARS, build_program, completion_text
from .problems import Problem
from .rewards import TEST, RewardConfig, verdict_test_reward
from .verdicts import Verdict, VerdictStatus
from .verifier import Verifier

log = logging.getLogger(__name__)


class SandboxTestReward:
    """The test component: every completion runs against its problem's tests in the sandbox."""

    def __init__(
        self, verifier: Verifier, problems: Mapping[str, Problem], config: RewardConfig
    ) -> None:
        self.verifier = verifier
        self.problems = problems
        self.config = config
        self.__name__ = "test_reward"

    def _samples(
        self, completions: list[Any], task_id: list[Any], completion_ids: list[Any] | None
    ) -> list[dict[str, Any]]:
        samples = [
            {"task_id": tid, "completion": completion_text(completion)}
            for tid, completion in zip(task_id, completions, strict=True)
        ]
        for sample, ids in zip(samples, completion_ids or (), strict=False):
            sample["completion_ids"] = ids
        return samples

    def _rewards(self, verdicts: list[Verdict], kwargs: Mapping[str, Any]) -> list[float | None]:
        errors = [v.task_id for v in verdicts if v.status is VerdictStatus.SANDBOX_ERROR]
        if errors:
            log.warning(
                "%d of %d completions hit a sandbox error (%s): %s",
                len(errors),
                len(verdicts),
                ", ".join(sorted(set(errors))),
                "no reward" if self.config.sandbox_errors == "exclude" else "rewarded as failures",
            )
        if callable(kwargs.get("log_metric")):
            kwargs["log_metric"]("verifier/sandbox_errors", float(len(errors)))
        if callable(kwargs.get("log_extra")):
            kwargs["log_extra"]("status", [v.status.value for v in verdicts])
        rewards = [
            verdict_test_reward(
                self.config, v.passed, v.pass_fraction, v.status is VerdictStatus.SANDBOX_ERROR
            )
            for v in verdicts
        ]
        return [None if r is None else self.config.weight(TEST) * r for r in rewards]

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task_id: list[Any],
        completion_ids: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        samples = self._samples(completions, task_id, completion_ids)
        return self._rewards(self.verifier.verify(self.problems, samples), kwargs)


class AsyncSandboxTestReward(SandboxTestReward):
    """The same, awaited on TRL's event loop so other async rewards run meanwhile."""

    async def __call__(  # type: ignore[override]
        self,
        prompts: list[Any],
        completions: list[Any],
        task_id: list[Any],
        completion_ids: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        samples = self._samples(completions, task_id, completion_ids)
        return self._rewards(await self.verifier.averify(self.problems, samples), kwargs)


class RuleReward:
    """One text-only component (format, syntax, length, forbidden, a custom one), scaled by its
    weight."""

    def __init__(
        self,
        component: str,
        problems: Mapping[str, Problem],
        config: RewardConfig,
        completion_style: str = "auto",
    ) -> None:
        terms = config.terms()
        if component not in terms:
            raise ValueError(f"not a rule component: {component!r} (one of {', '.join(terms)})")
        self.term = terms[component]
        self.component = component
        self.problems = problems
        self.config = config
        self.completion_style = completion_style
        self.__name__ = f"{component}_reward"

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task_id: list[Any],
        completion_ids: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        weight = self.config.weight(self.component)
        rewards = []
        for index, (tid, completion) in enumerate(zip(task_id, completions, strict=True)):
            text = completion_text(completion)
            if len(text) > MAX_COMPLETION_CHARS:  # as the verifier: unread, the floor
                rewards.append(weight * self.term.floor)
                continue
            problem = self.problems[str(tid)]
            program = build_program(problem, text, self.completion_style)  # type: ignore[arg-type]
            if self.config.term_params("length").unit == "tokens":
                if completion_ids is None:
                    raise ValueError("the length term's unit 'tokens' needs completion_ids")
                length = len(completion_ids[index])
            else:
                length = len(text)
            rewards.append(weight * self.config.term_value(self.component, text, program, length))
        return rewards


def make_trl_reward_funcs(
    verifier: Verifier,
    problems: Mapping[str, Problem],
    config: RewardConfig | None = None,
    *,
    asynchronous: bool = False,
) -> list[Callable[..., Any]]:
    """TRL ``reward_funcs`` for every component with a non-zero weight (the dataset needs a
    ``task_id`` column). ``config`` defaults to the verifier's."""
    config = config or verifier.reward_config
    funcs: list[Callable[..., Any]] = []
    if config.weight(TEST):
        test_cls = AsyncSandboxTestReward if asynchronous else SandboxTestReward
        funcs.append(test_cls(verifier, problems, config))
    funcs += [
        RuleReward(name, problems, config, verifier.completion_style)
        for name in config.terms()
        if config.weight(name)
    ]
    if not funcs:
        raise ValueError("every reward weight is 0: nothing to reward")
    return funcs
