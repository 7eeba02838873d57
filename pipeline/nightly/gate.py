"""The promotion gate: a night's checkpoint replaces the series' champion only when it is
significantly better on the gate benchmark and not significantly worse on any guard.

Both models are evaluated on the same problems in the night's run (the champion is the night's
``base``), so each comparison is paired, problem by problem: greedy pass@1 with the exact
McNemar test, sampled pass@k with the paired bootstrap (:mod:`..reporting.stats`). The decision
table (:func:`decide`) is plain data in, a verdict and its reason out. Before any test, each
evaluation the gate reads must be of the checkpoint it stands for and on the problems the night
read (:func:`check_evaluation`): an evaluation reused from before the data changed decides
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..reporting.report import Evaluation, check_same_problems, format_p_value
from ..reporting.stats import Interval, compare_greedy, compare_sampled
from ..settings import Settings


class GateConfig(Settings):
    """When a night's checkpoint becomes the champion."""

    benchmark: str | None = Field(
        None,
        description="the evaluation (a name in the run's `evaluations`) the night must be "
        "significantly better on; default: the first",
    )
    guards: list[str] = Field(
        default_factory=list,
        description="evaluations the night must not be significantly worse on (e.g. humaneval "
        "when training on MBPP)",
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level of every test")
    run: Literal["greedy", "sampled"] = Field(
        "greedy",
        description="greedy pass@1 (exact McNemar) or sampled pass@k (paired bootstrap); the "
        "evaluations must make that run",
    )
    k: int = Field(1, ge=1, description="k of sampled pass@k")


class Comparison(BaseModel):
    """The night's checkpoint against the champion on one benchmark's problems."""

    model_config = ConfigDict(frozen=True)

    benchmark: str
    test: Literal["exact McNemar", "paired bootstrap"]
    problems: int
    champion: float  # pass@k of each
    night: float
    champion_ci95: Interval | None = None
    night_ci95: Interval | None = None
    difference: float  # night - champion
    difference_ci95: Interval | None = None  # paired bootstrap only
    gained: int | None = None  # greedy only: failed by the champion, passed by the night
    lost: int | None = None
    p_value: float

    def significantly(self, alpha: float) -> Literal["better", "worse", "no different"]:
        if self.p_value >= alpha or self.difference == 0:
            return "no different"
        return "better" if self.difference > 0 else "worse"

    def summary(self) -> str:
        counts = f", +{self.gained}/-{self.lost}" if self.gained is not None else ""
        interval = (
            f", 95% CI [{self.difference_ci95[0]:+.4f}, {self.difference_ci95[1]:+.4f}]"
            if self.difference_ci95 is not None
            else ""
        )
        return (
            f"{self.benchmark}: {self.champion:.4f} -> {self.night:.4f} "
            f"(Δ {self.difference:+.4f}{counts}{interval}, {self.test} "
            f"p={format_p_value(self.p_value)})"
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
    benchmark: str, champion: Evaluation, night: Evaluation, config: GateConfig
) -> Comparison:
    """The paired test of ``night`` against ``champion`` that ``config.run`` asks for;
    ProblemsDiffer when they were not evaluated on the same problems."""
    check_same_problems(champion, night)
    scores = [getattr(e.results, config.run) for e in (champion, night)]
    if None in scores or config.run not in champion.counts or config.run not in night.counts:
        raise ValueError(f"{benchmark}: the gate compares the {config.run} run, not evaluated")
    k = 1 if config.run == "greedy" else config.k
    intervals = {
        "champion_ci95": scores[0].ci95.get(k),
        "night_ci95": scores[1].ci95.get(k),
    }
    if config.run == "greedy":
        before, after = champion.greedy(), night.greedy()
        assert before is not None and after is not None
        greedy = compare_greedy(before, after)
        return Comparison(
            benchmark=benchmark,
            test="exact McNemar",
            problems=greedy.problems,
            champion=greedy.before_passed / greedy.problems,
            night=greedy.after_passed / greedy.problems,
            difference=greedy.difference,
            gained=greedy.gained,
            lost=greedy.lost,
            p_value=greedy.p_value,
            **intervals,
        )
    sampled = compare_sampled(champion.counts["sampled"], night.counts["sampled"], k)
    return Comparison(
        benchmark=benchmark,
        test="paired bootstrap",
        problems=sampled.problems,
        champion=sampled.before,
        night=sampled.after,
        difference=sampled.difference,
        difference_ci95=sampled.difference_ci95,
        p_value=sampled.p_value,
        **intervals,
    )


def decide(
    alpha: float,
    gate: Comparison | None,
    guards: list[Comparison],
    *,
    failed: str | None = None,
    trained: bool = True,
    verify_problems: list[str] | None = None,
) -> tuple[bool, str]:
    """Whether the night's checkpoint becomes the champion, and why; the first row that
    applies decides: a failed night, a night that trained nothing, a checkpoint that does
    not verify against its manifest, no significant gain, a guard significantly worse; else
    promote."""
    if failed is not None:
        return False, f"the night failed: {failed}"
    if not trained:
        return False, "the night made no checkpoint"
    if verify_problems:
        return False, f"its checkpoint does not verify: {'; '.join(verify_problems)}"
    if gate is None:
        return False, "no gate comparison"
    if gate.significantly(alpha) != "better":
        return False, f"no significant gain at alpha={alpha}: {gate.summary()}"
    worse = [guard for guard in guards if guard.significantly(alpha) == "worse"]
    if worse:
        listed = "; ".join(guard.summary() for guard in worse)
        return False, f"significantly worse on a guard at alpha={alpha}: {listed}"
    return True, f"significant gain at alpha={alpha}: {gate.summary()}"
