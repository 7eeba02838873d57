"""Best-of-n with a reward model: of the n completions sampled for a problem, keep the one the
reward model scores highest, and count how often the kept one passes (pass@1 after reranking).

It is set against three other ways to pick one of the same n:

- ``random``: any of them, so its pass@1 is the problem's share of passing samples (exactly,
  not one draw);
- ``likelihood``: the highest mean token log-probability under the sampling distribution (the
  sampler's logprobs: the model's own preference, at no extra cost);
- ``oracle``: the verifier itself, a passing one whenever there is one (pass@n, the ceiling).

Only problems the reward model did not train on count (its manifest lists those it did); ties
go to the earliest sample. Samples of a problem whose samples all pass, or all fail, are not
scored: every pick has the same verdict there. Each pick's pass@1 has its interval (Wilson for one pick per
problem, a bootstrap over problems for the random pick's shares), and the reward model's pick
is compared with each other on the same problems: the difference, a paired bootstrap interval
and the sign-flip test's p (:func:`.stats.compare_sampled` with k = 1). ``rerank.json`` keeps
every problem's counts and picks, so the comparison can be computed again from it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..atomic import staged
from ..reward_models import RewardModelSettings, trained_problems
from .stats import Interval, SampledComparison, bootstrap_interval, compare_sampled, wilson_interval

log = logging.getLogger(__name__)

RERANK_FILE = "rerank.json"
PICKS = ("likelihood", "reward-model", "oracle")  # one sample per problem; random is a share
AGAINST = ("random", "likelihood", "oracle")  # what the reward model's pick is compared with


class RerankConfig(RewardModelSettings):
    """Best-of-n: the reward model that picks one of each problem's sampled completions."""


class ProblemPicks(BaseModel):
    """One problem: its samples, how many passed, and whether each pick (of :data:`PICKS`)
    passed."""

    model_config = ConfigDict(frozen=True)

    samples: int
    passed: int
    picked: dict[str, bool]


class PickResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    pass_at_1: float
    ci95: Interval


class BestOfN(BaseModel):
    """pass@1 of each way to pick, and the reward model's pick against the others."""

    model_config = ConfigDict(frozen=True)

    reward_model: str
    problems: int
    samples: int
    left_out_trained: int  # problems the reward model trained on, not counted
    picks: dict[str, PickResult]  # random, likelihood, reward-model, oracle
    comparisons: dict[str, SampledComparison]  # "reward-model - <other>"
    per_problem: dict[str, ProblemPicks]


def mean_logprob(row: Mapping[str, Any]) -> float:
    """The mean sampling log-probability of a completion's tokens (those the sampler kept)."""
    kept = [lp for lp in row["sampling_logprobs"] if lp is not None and not math.isnan(lp)]
    return sum(kept) / len(kept) if kept else -math.inf


def _first_best(group: Sequence[Mapping[str, Any]], key: str) -> bool:
    """Whether the sample with the highest ``key`` (the earliest among equals) passed."""
    best = max(range(len(group)), key=lambda i: (group[i][key], -i))
    return bool(group[best]["passed"])


def best_of_n(
    rows: Sequence[Mapping[str, Any]], scores: Sequence[float], reward_model: str, left_out: int
) -> BestOfN:
    """Each problem's picks among its ``rows`` (sampled completions, scored by the verifier),
    the reward model's ``scores`` of them given in the same order. A sample the sandbox failed
    on has no verdict to pick: it is left out (a problem with no other, with it)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row, score in zip(rows, scores, strict=True):
        if row.get("status") == "sandbox_error":
            continue
        groups[row["prompt_id"]].append(
            {**row, "reward_model_score": score, "mean_logprob": mean_logprob(row)}
        )
    per_problem = {
        task: ProblemPicks(
            samples=len(group),
            passed=sum(bool(row["passed"]) for row in group),
            picked={
                "likelihood": _first_best(group, "mean_logprob"),
                "reward-model": _first_best(group, "reward_model_score"),
                "oracle": any(row["passed"] for row in group),
            },
        )
        for task, group in sorted(groups.items())
    }
    # each pick as (samples, passed) counts, so that pass@1 of a share and of one pick compare
    counts = {
        "random": {task: (p.samples, p.passed) for task, p in per_problem.items()},
        **{
            pick: {task: (1, int(p.picked[pick])) for task, p in per_problem.items()}
            for pick in PICKS
        },
    }
    shares = {task: p.passed / p.samples for task, p in per_problem.items()}
    random_pick = sum(shares.values()) / len(shares)
    picks = {"random": PickResult(pass_at_1=random_pick, ci95=bootstrap_interval(shares))}
    for pick in PICKS:
        passed = sum(c for _, c in counts[pick].values())
        picks[pick] = PickResult(
            pass_at_1=passed / len(per_problem), ci95=wilson_interval(passed, len(per_problem))
        )
    return BestOfN(
        reward_model=reward_model,
        problems=len(per_problem),
        samples=sum(p.samples for p in per_problem.values()),
        left_out_trained=left_out,
        picks=picks,
        comparisons={
            f"reward-model - {other}": compare_sampled(counts[other], counts["reward-model"], 1)
            for other in AGAINST
        },
        per_problem=per_problem,
    )


def decisive_scores(config: RerankConfig, rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The reward model's scores of ``rows``, computed only where they decide a pick: in a
    problem whose samples all pass or all fail every pick has the same verdict, so its samples
    get 0 unscored (on a CPU the model's forward passes are most of best-of-n's cost)."""
    verdicts: dict[str, set[bool]] = defaultdict(set)
    for row in rows:
        verdicts[row["prompt_id"]].add(bool(row["passed"]))
    mixed = [i for i, row in enumerate(rows) if len(verdicts[row["prompt_id"]]) == 2]
    scores = [0.0] * len(rows)
    for i, score in zip(mixed, config.score([rows[i] for i in mixed]), strict=True):
        scores[i] = score
    return scores


def rerank(config: RerankConfig, rows: Sequence[Mapping[str, Any]], path: Path) -> BestOfN:
    """Best-of-n of ``rows`` (an evaluation's sampled run) with ``config``'s reward model, on
    the problems it did not train on; written to ``path`` and logged as a table."""
    trained = trained_problems(config.reward_model)
    unseen = [row for row in rows if row["prompt_id"] not in trained]
    left_out = len({row["prompt_id"] for row in rows} & trained)
    if not unseen:
        raise ValueError(
            f"rerank: the reward model {config.reward_model} trained on all {left_out} problems "
            "evaluated; evaluate it on problems it did not train on"
        )
    result = best_of_n(unseen, decisive_scores(config, unseen), config.reward_model, left_out)
    with staged(path) as staging:
        staging.write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    log.info("best-of-n on %d problems (%d left out: trained on)", result.problems, left_out)
    for name, pick in result.picks.items():
        log.info("  %-12s pass@1 %.3f [%.3f, %.3f]", name, pick.pass_at_1, *pick.ci95)
    for name, comparison in result.comparisons.items():
        low, high = comparison.difference_ci95
        log.info(
            "  %-25s %+.3f [%+.3f, %+.3f], p = %.3g",
            name,
            comparison.difference,
            low,
            high,
            comparison.p_value,
        )
    return result
