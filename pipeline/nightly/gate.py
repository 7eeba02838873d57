"""The promotion gate: a night's checkpoint replaces the series' champion only when it is
significantly better on the gate benchmark, at the night's share of the series' alpha, and
shown not worse than the champion by more than a margin on every guard.

Both models are evaluated on the same problems in the night's run (the champion is the night's
``base``), so each comparison is paired, problem by problem: greedy pass@1 with the exact
McNemar test, sampled pass@k with the sign-flip test (:mod:`..reporting.stats`). The gate
tests one-sided, at a level that falls with each night tested against the same champion
(:class:`Spend`): the levels of all its nights sum to alpha, so however many nights run, a
champion that no night improves on is replaced at most alpha of the time. A guard tests
non-inferiority (:func:`greedy_noninferiority_p`, :func:`mean_noninferiority_p`): a veto on a
significant loss alone lets a real loss through whenever the guard has too few problems to
see it. The decision table (:func:`decide`) is plain data in, a verdict and its reason out.
Before any test, each evaluation the gate reads must be of the checkpoint it stands for and on
the problems the night read (:func:`check_evaluation`): an evaluation reused from before the
data changed decides nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from ...settings.config import Settings
from ..reporting.report import Evaluation, check_same_problems, format_p_value
from ..reporting.stats import Interval, compare_greedy, compare_sampled, pass_at_k_per_problem


class GateConfig(Settings):
    """When a night's checkpoint becomes the champion."""

    benchmark: str | None = Field(
        None,
        description="the evaluation (a name in the run's `evaluations`) the night must be "
        "significantly better on; default: the first",
    )
    guards: list[str] = Field(
        default_factory=list,
        description="evaluations the night must be shown not worse on by more than `margin` "
        "(e.g. humaneval when training on MBPP)",
    )
    alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="the series' false-promotion rate: over any number of nights, a champion "
        "that no night improves on is replaced at most this often (its first n nights spend "
        "alpha * (1 - 1 / (1 + ln(n + 1))) of it)",
    )
    margin: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="a guard passes when the night is shown worse than the champion by less "
        "than this much pass@k (0.05: 5 points), one-sided at `guard_alpha`",
    )
    guard_alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="a night worse than the champion on a guard by `margin` or more passes "
        "that guard at most this often",
    )
    run: Literal["greedy", "sampled"] = Field(
        "greedy",
        description="greedy pass@1 (exact McNemar) or sampled pass@k (sign-flip test); the "
        "evaluations must make that run",
    )
    k: int = Field(1, ge=1, description="k of sampled pass@k")


class Spend(BaseModel):
    """The night's share of the series' alpha: its test is the ``test``-th against its
    champion, at one-sided ``level``. Recorded with the decision, it is what the next night
    counts from, and what the night keeps when it is asked again."""

    model_config = ConfigDict(frozen=True)

    test: int = Field(ge=1, description="the n-th night tested against this champion")
    level: float = Field(description="the one-sided level of its test")
    spent: float = Field(description="alpha spent on this champion, this night's included")

    @classmethod
    def of(cls, alpha: float, test: int) -> Spend:
        return cls(test=test, level=level(alpha, test), spent=spent(alpha, test))


def spent(alpha: float, tests: int) -> float:
    """The alpha a champion's first ``tests`` nights spend: alpha (1 - 1 / (1 + ln(tests + 1))),
    0 before the first, below alpha after any number. It keeps 23% of alpha for the nights
    after the 30th, where alpha 6 / (pi^2 n^2) keeps 2%: a gain that comes late in a long
    reign can still be seen (benchmarks/nightly_gate.py)."""
    return alpha * (1 - 1 / (1 + math.log(tests + 1)))


def level(alpha: float, test: int) -> float:
    """The level of the ``test``-th night against one champion: what it adds to
    :func:`spent`. The levels sum to less than alpha over any number of nights, so by the
    union bound the chance that any of them promotes a checkpoint no better than the champion
    is at most alpha, however the nights depend on each other."""
    if test < 1:
        raise ValueError(f"the first night tested against a champion is test 1, got {test}")
    return spent(alpha, test) - spent(alpha, test - 1)


class Comparison(BaseModel):
    """The night's checkpoint against the champion on one benchmark's problems."""

    model_config = ConfigDict(frozen=True)

    benchmark: str
    # "paired bootstrap": the sampled test of records written before the sign-flip test
    test: Literal["exact McNemar", "sign-flip", "paired bootstrap"]
    problems: int
    champion: float  # pass@k of each
    night: float
    champion_ci95: Interval | None = None
    night_ci95: Interval | None = None
    difference: float  # night - champion
    difference_ci95: Interval | None = None  # sampled only
    gained: int | None = None  # greedy only: failed by the champion, passed by the night
    lost: int | None = None
    p_value: float  # two-sided
    margin: float | None = None  # a guard's
    noninferiority_p: float | None = Field(
        None, description="one-sided p of 'the night is worse by margin or more' (a guard's)"
    )

    @property
    def p_gain(self) -> float:
        """The one-sided p of a gain: half the two-sided p, the null distribution of either
        test being symmetric; 1 when the night is not ahead."""
        return self.p_value / 2 if self.difference > 0 else 1.0

    def summary(self) -> str:
        counts = f", +{self.gained}/-{self.lost}" if self.gained is not None else ""
        interval = (
            f", 95% CI [{self.difference_ci95[0]:+.4f}, {self.difference_ci95[1]:+.4f}]"
            if self.difference_ci95 is not None
            else ""
        )
        within = (
            f"; worse by {self.margin:g} or more: p={format_p_value(self.noninferiority_p)}"
            if self.margin is not None and self.noninferiority_p is not None
            else ""
        )
        return (
            f"{self.benchmark}: {self.champion:.4f} -> {self.night:.4f} "
            f"(Δ {self.difference:+.4f}{counts}{interval}, {self.test} "
            f"p={format_p_value(self.p_value)}{within})"
        )


class StaleEvaluation(ValueError):
    """An evaluation of another checkpoint, or on other problems, than the night's."""


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two names of a checkpoint (relative or absolute paths, hub ids) are one."""
    return a == b or Path(a).resolve() == Path(b).resolve()


def check_evaluation(
    name: str, evaluation: Evaluation, checkpoint: str, fingerprint: str | None
) -> Evaluation:
    """``evaluation``, once it is known to be of ``checkpoint`` on the problems whose content
    hash is ``fingerprint`` (None: not checked); else StaleEvaluation naming it and what
    differs."""
    results = evaluation.results
    differs = []
    if not same_checkpoint(results.checkpoint, checkpoint):
        differs.append(f"it evaluated {results.checkpoint}, not {checkpoint}")
    if fingerprint is not None and results.problems_fingerprint != fingerprint:
        differs.append(
            f"its problems_fingerprint is {results.problems_fingerprint}, the night read "
            f"{fingerprint}"
        )
    if differs:
        folder = evaluation.folder
        raise StaleEvaluation(
            f"the {name} evaluation ({folder}) is not the night's: {'; '.join(differs)}; the "
            f"gate does not decide on it (delete {folder} and {folder}.json to evaluate again)"
        )
    return evaluation


def compare(
    benchmark: str,
    champion: Evaluation,
    night: Evaluation,
    config: GateConfig,
    *,
    margin: float | None = None,
) -> Comparison:
    """The paired test of ``night`` against ``champion`` that ``config.run`` asks for, and
    with a ``margin`` (a guard's) the non-inferiority test; ProblemsDiffer when they were not
    evaluated on the same problems."""
    check_same_problems(champion, night)
    scores = [getattr(e.results, config.run) for e in (champion, night)]
    if None in scores or config.run not in champion.counts or config.run not in night.counts:
        raise ValueError(f"{benchmark}: the gate compares the {config.run} run, not evaluated")
    k = 1 if config.run == "greedy" else config.k
    common = {
        "benchmark": benchmark,
        "champion_ci95": scores[0].ci95.get(k),
        "night_ci95": scores[1].ci95.get(k),
        "margin": margin,
    }
    if config.run == "greedy":
        before, after = champion.greedy(), night.greedy()
        assert before is not None and after is not None
        greedy = compare_greedy(before, after)
        return Comparison(
            test="exact McNemar",
            problems=greedy.problems,
            champion=greedy.before_passed / greedy.problems,
            night=greedy.after_passed / greedy.problems,
            difference=greedy.difference,
            gained=greedy.gained,
            lost=greedy.lost,
            p_value=greedy.p_value,
            noninferiority_p=None
            if margin is None
            else float(
                greedy_noninferiority_p(greedy.gained, greedy.lost, greedy.problems, margin)
            ),
            **common,
        )
    before_counts, after_counts = champion.counts["sampled"], night.counts["sampled"]
    sampled = compare_sampled(before_counts, after_counts, k)
    before_k = pass_at_k_per_problem(before_counts, k)
    after_k = pass_at_k_per_problem(after_counts, k)
    return Comparison(
        test="sign-flip",
        problems=sampled.problems,
        champion=sampled.before,
        night=sampled.after,
        difference=sampled.difference,
        difference_ci95=sampled.difference_ci95,
        p_value=sampled.p_value,
        noninferiority_p=None
        if margin is None
        else mean_noninferiority_p([after_k[t] - before_k[t] for t in sorted(after_k)], margin),
        **common,
    )


def greedy_noninferiority_p(
    gained: npt.ArrayLike, lost: npt.ArrayLike, problems: int, margin: float
) -> np.ndarray:
    """One-sided p of "the night's pass@1 is below the champion's by ``margin`` or more" from
    the paired counts: Tango's score test (Stat. Med. 1998), the variance of the difference
    taken at the most likely cell probabilities with the difference at exactly -margin (the
    larger root of 2n q^2 - b q + lost m (1 + m) = 0, q the chance of a loss). Its size stays
    near its level down to a handful of discordant problems, where the plain Wald test's does
    not. Element-wise over arrays of counts (the series simulation's)."""
    from scipy.stats import norm  # a second of start-up: loaded when used

    gained, lost = np.asarray(gained, dtype=float), np.asarray(lost, dtype=float)
    both_or_neither = problems - gained - lost
    b = gained * (1 + margin) + lost * (1 + 3 * margin) + 2 * both_or_neither * margin
    loss = (b + np.sqrt(b * b - 8 * problems * lost * margin * (1 + margin))) / (4 * problems)
    variance = problems * (2 * loss - margin - margin * margin)
    return norm.sf((gained - lost + problems * margin) / np.sqrt(variance))


def mean_noninferiority_p(differences: Sequence[float], margin: float) -> float:
    """One-sided p of "the mean per-problem difference (night - champion) is -``margin`` or
    less": the one-sample t-test of the differences against -margin."""
    from scipy.stats import t

    values = np.asarray(differences, dtype=float)
    shifted = float(values.mean()) + margin
    spread = float(values.std(ddof=1)) / math.sqrt(values.size) if values.size > 1 else 0.0
    if spread == 0:  # every problem moved by the same amount: no doubt left
        return 0.0 if shifted > 0 else 1.0
    return float(t.sf(shifted / spread, values.size - 1))


def decide(
    config: GateConfig,
    spend: Spend | None,
    gate: Comparison | None,
    guards: list[Comparison],
    *,
    failed: str | None = None,
    trained: bool = True,
    verify_problems: list[str] | None = None,
) -> tuple[bool, str]:
    """Whether the night's checkpoint becomes the champion, and why; the first row that
    applies decides: a failed night, a night that trained nothing, a checkpoint that does
    not verify against its manifest, no gain significant at the night's level, a guard not
    shown within the margin; else promote."""
    if failed is not None:
        return False, f"the night failed: {failed}"
    if not trained:
        return False, "the night made no checkpoint"
    if verify_problems:
        return False, f"its checkpoint does not verify: {'; '.join(verify_problems)}"
    if gate is None or spend is None:
        return False, "no gate comparison"
    at = (
        f"one-sided p={gate.p_gain:.3g} against level {spend.level:.3g} (night {spend.test} "
        f"tested against this champion, alpha={config.alpha} over the series)"
    )
    if gate.p_gain >= spend.level:
        return False, f"no significant gain: {at}: {gate.summary()}"
    unproven = [
        guard
        for guard in guards
        if guard.noninferiority_p is None or guard.noninferiority_p >= config.guard_alpha
    ]
    if unproven:
        listed = "; ".join(guard.summary() for guard in unproven)
        return False, (
            f"not shown within {config.margin:g} of the champion on a guard at "
            f"alpha={config.guard_alpha}: {listed}"
        )
    return True, f"significant gain: {at}: {gate.summary()}"
