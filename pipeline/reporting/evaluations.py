"""An evaluation's record: ``evaluation.json`` (the :class:`EvaluationResults` model: pass@k
with its 95% interval per run), ``per_problem.jsonl`` (each problem's counts, a
:class:`ProblemResult` a line: what every paired comparison is computed from, small enough to
commit) and ``samples.jsonl`` (every scored completion), written by the ``evaluate`` stage and
read back by the report and ``codepost evaluate --compare``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from ..atomic import write_text
from .stats import bootstrap_interval, pass_at_k_per_problem, wilson_interval

RESULTS_FILE = "evaluation.json"
SAMPLES_FILE = "samples.jsonl"
PER_PROBLEM_FILE = "per_problem.jsonl"
RUNS = ("greedy", "sampled")


class RunResult(BaseModel):
    """One run of an evaluation (greedy or sampled): pass@k and its 95% interval for each k,
    and the counts. On disk each k is a pair of flat keys, ``pass@k`` and ``pass@k_ci95``."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    pass_at_k: dict[int, float] = Field(description="NaN where some problem has < k samples")
    ci95: dict[int, tuple[float, float] | None] = Field(default_factory=dict)
    samples: int
    passed: int
    sandbox_errors: int = 0
    excluded_sandbox_errors: int = 0
    temperature: float

    @model_validator(mode="before")
    @classmethod
    def _from_flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "pass_at_k" in data:
            return data
        data, pass_at_k, ci95 = dict(data), {}, {}
        for key in [key for key in data if key.startswith("pass@")]:
            k = key.removeprefix("pass@")
            if k.endswith("_ci95"):
                ci95[int(k.removesuffix("_ci95"))] = data.pop(key)
            else:
                pass_at_k[int(k)] = data.pop(key)
        return {**data, "pass_at_k": pass_at_k, "ci95": ci95}

    @model_serializer(mode="wrap")
    def _to_flat_keys(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        pass_at_k, ci95 = data.pop("pass_at_k"), data.pop("ci95")
        flat: dict[str, Any] = {}
        for k, value in pass_at_k.items():
            flat[f"pass@{k}"], flat[f"pass@{k}_ci95"] = value, ci95.get(k)
        return {**flat, **data}


class TurnsResult(BaseModel):
    """A run of episodes turn by turn (``max_turns`` > 1): pass@1 of the answer each episode
    holds after turn 1, 2, ..., T (its final one, once it ended), with its 95% interval; the
    repair rate (of the samples whose first answer failed, the share whose last passes) with
    its interval; and the paired test of turn 1 against turn T over problems (exact McNemar for
    greedy, the sign-flip test for sampled)."""

    model_config = ConfigDict(frozen=True)

    pass_at_1: list[float]
    ci95: list[tuple[float, float] | None]
    failed_first: int = Field(description="samples whose turn-1 answer failed")
    repaired: int = Field(description="of them, those whose last answer passed")
    repair_rate: float = Field(description="repaired / failed_first; NaN when none failed")
    repair_ci95: tuple[float, float] | None
    first_vs_last_p: float = Field(description="paired test of turn 1 against turn T")


def turns_result(rows_by_turn: list[list[dict[str, Any]]]) -> TurnsResult:
    """:class:`TurnsResult` of scored rows, one list per turn, the same samples in the same
    order in each (``prompt_id``, ``passed``)."""
    from .stats import compare_greedy, compare_sampled

    first, last = rows_by_turn[0], rows_by_turn[-1]
    scores = [pass_at_k_of_rows(rows, [1]) for rows in rows_by_turn]
    counts = [problem_counts(rows) for rows in (first, last)]
    greedy = all(n == 1 for n, _ in counts[0].values())
    failed: dict[str, int] = {}
    repaired: dict[str, int] = {}
    for before, after in zip(first, last, strict=True):
        if not before["passed"]:
            task = before["prompt_id"]
            failed[task] = failed.get(task, 0) + 1
            repaired[task] = repaired.get(task, 0) + bool(after["passed"])
    failed_first, repaired_total = sum(failed.values()), sum(repaired.values())
    if not failed_first:
        interval = None
    elif greedy:
        interval = wilson_interval(repaired_total, failed_first)
    else:  # several samples a problem: the problems are the units
        interval = bootstrap_interval({t: repaired[t] / failed[t] for t in failed})
    if greedy:
        p_value = compare_greedy(
            {t: bool(c) for t, (_, c) in counts[0].items()},
            {t: bool(c) for t, (_, c) in counts[1].items()},
        ).p_value
    else:
        p_value = compare_sampled(counts[0], counts[1], 1).p_value
    return TurnsResult(
        pass_at_1=[score["pass@1"] for score in scores],
        ci95=[score["pass@1_ci95"] for score in scores],
        failed_first=failed_first,
        repaired=repaired_total,
        repair_rate=repaired_total / failed_first if failed_first else math.nan,
        repair_ci95=interval,
        first_vs_last_p=p_value,
    )


class EvaluationResults(BaseModel):
    """What ``evaluation.json`` holds: the checkpoint, its problems and settings, and each run's
    scores. The problems and settings stay plain records, so a file written with other
    settings' fields still reads."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    checkpoint: str
    problems: dict[str, Any] = Field(default_factory=dict, description="the ProblemSet")
    problems_fingerprint: str | None = Field(None, description="hash of the problems' content")
    num_problems: int
    config: dict[str, Any] = Field(default_factory=dict, description="the EvalConfig")
    greedy: RunResult | None = None
    sampled: RunResult | None = None
    turns: dict[str, TurnsResult] | None = Field(
        None, description="episodes: each run turn by turn (the run's own scores are turn T's)"
    )

    def runs(self) -> dict[str, RunResult]:
        """The runs this evaluation made, greedy first."""
        return {name: run for name in RUNS if (run := getattr(self, name)) is not None}

    def sandbox_errors(self, run: str | None = None) -> int:
        """Sandbox errors of ``run`` (None: of every run)."""
        return sum(r.sandbox_errors for name, r in self.runs().items() if run in (None, name))

    def to_json(self) -> dict[str, Any]:
        """The record on disk: runs not made (and single turns' ``turns``) left out, a NaN pass@k
        kept NaN (not null), as ``json.dumps`` wrote it before this model."""
        absent = {n for n in RUNS if n not in self.runs()} | (
            {"turns"} if self.turns is None else set()
        )
        return self.model_dump(mode="json", exclude=absent)

    @classmethod
    def read(cls, path: Path) -> EvaluationResults:
        return cls.model_validate(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> Path:
        return write_text(path, json.dumps(self.to_json(), indent=2) + "\n")


def problem_counts(
    rows: list[dict[str, Any]], *, exclude_sandbox_errors: bool = False
) -> dict[str, tuple[int, int]]:
    """(samples, passed) per problem of scored rows: what pass@k and its intervals are made of."""
    counts: dict[str, tuple[int, int]] = {}
    for row in rows:
        if exclude_sandbox_errors and row["status"] == "sandbox_error":
            continue
        n, c = counts.get(row["prompt_id"], (0, 0))
        counts[row["prompt_id"]] = (n + 1, c + bool(row["passed"]))
    return counts


def pass_at_k_of_rows(
    rows: list[dict[str, Any]], ks: list[int], *, exclude_sandbox_errors: bool = False
) -> dict[str, Any]:
    """Per-problem unbiased pass@k averaged over problems, from scored rows, each with its 95%
    interval (``pass@k_ci95``): Wilson for one greedy sample per problem, a bootstrap over
    problems otherwise."""
    counts = problem_counts(rows, exclude_sandbox_errors=exclude_sandbox_errors)
    scores: dict[str, Any] = {}
    for k in ks:
        if not counts or any(n < k for n, _ in counts.values()):
            scores[f"pass@{k}"], scores[f"pass@{k}_ci95"] = math.nan, None
            continue
        per_problem = pass_at_k_per_problem(counts, k)
        scores[f"pass@{k}"] = sum(per_problem.values()) / len(per_problem)
        if all(n == 1 for n, _ in counts.values()):
            scores[f"pass@{k}_ci95"] = wilson_interval(
                sum(c for _, c in counts.values()), len(counts)
            )
        else:
            scores[f"pass@{k}_ci95"] = bootstrap_interval(per_problem)
    return scores


EPISODE_FIELDS = ("greedy_turn_passed", "turn_passed", "failed_first", "repaired")


class ProblemResult(BaseModel):
    """One problem of an evaluation: a line of ``per_problem.jsonl``. A run not made is null.
    Sandbox errors are counted as failures (``passed`` does not include them), as a paired
    test needs every problem scored on both sides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    greedy_passed: bool | None = Field(None, description="the greedy completion passed")
    greedy_sandbox_error: bool | None = Field(None, description="it hit a sandbox error")
    n: int | None = Field(None, ge=1, description="sampled completions scored")
    passed: int | None = Field(None, ge=0, description="of them, those that passed")
    sandbox_errors: int | None = Field(None, ge=0, description="of them, sandbox errors")
    # Episodes (``episodes.max_turns`` > 1): how each turn's answers did
    greedy_turn_passed: list[bool] | None = Field(
        None, description="episodes: the greedy episode's answer after each turn passed"
    )
    turn_passed: list[int] | None = Field(
        None, description="episodes: of the sampled episodes, those passing after each turn"
    )
    failed_first: int | None = Field(
        None, ge=0, description="episodes: sampled episodes whose first answer failed"
    )
    repaired: int | None = Field(
        None, ge=0, description="episodes: of them, those whose last answer passed"
    )

    @model_validator(mode="after")
    def _counts_fit(self) -> ProblemResult:
        if (self.n is None) != (self.passed is None):
            raise ValueError(
                f"n ({self.n}) and passed ({self.passed}) are both counts or both null"
            )
        if self.n is not None and (self.passed or 0) + (self.sandbox_errors or 0) > self.n:
            raise ValueError(
                f"passed ({self.passed}) + sandbox_errors ({self.sandbox_errors}) > n ({self.n})"
            )
        return self


def per_problem_results(rows: list[dict[str, Any]]) -> list[ProblemResult]:
    """Each problem's counts from scored rows of ``samples.jsonl`` (``run``, ``prompt_id``,
    ``passed``, ``status``), sorted by task id."""
    greedy: dict[str, dict[str, Any]] = {}
    sampled: dict[str, dict[str, Any]] = {}
    for row in rows:
        error = row["status"] == "sandbox_error"
        turns = row.get("turn_passed")  # episodes: each turn's answer passed
        if row["run"] == "greedy":
            greedy[row["prompt_id"]] = {
                "greedy_passed": bool(row["passed"]),
                "greedy_sandbox_error": error,
                **({"greedy_turn_passed": turns} if turns is not None else {}),
            }
        elif row["run"] == "sampled":
            counts = sampled.setdefault(
                row["prompt_id"], {"n": 0, "passed": 0, "sandbox_errors": 0}
            )
            counts["n"] += 1
            counts["passed"] += bool(row["passed"])
            counts["sandbox_errors"] += error
            if turns is not None:
                by_turn = counts.setdefault("turn_passed", [0] * len(turns))
                counts["turn_passed"] = [a + bool(b) for a, b in zip(by_turn, turns, strict=True)]
                counts["failed_first"] = counts.get("failed_first", 0) + (not turns[0])
                counts["repaired"] = counts.get("repaired", 0) + (not turns[0] and turns[-1])
    return [
        ProblemResult(task_id=task, **greedy.get(task, {}), **sampled.get(task, {}))
        for task in sorted(greedy.keys() | sampled.keys())
    ]


def write_per_problem(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``per_problem.jsonl`` of scored rows: a line per problem, sorted by task id (the
    episodes' fields only where the evaluation ran episodes)."""
    lines = [
        result.model_dump_json(exclude={k for k in EPISODE_FIELDS if getattr(result, k) is None})
        for result in per_problem_results(rows)
    ]
    return write_text(path, "".join(line + "\n" for line in lines))


def read_per_problem(path: Path) -> list[ProblemResult]:
    """The lines of a ``per_problem.jsonl``; ValueError names the file, the line and the key."""
    results: dict[str, ProblemResult] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            result = ProblemResult.model_validate_json(line)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = "".join(f"{part}: " for part in error["loc"])
            reason = error.get("ctx", {}).get("error", error["msg"])  # a validator's own words
            raise ValueError(f"{path} line {number}: {key}{reason}") from None
        if result.task_id in results:
            raise ValueError(f"{path} line {number}: task_id {result.task_id!r} again")
        results[result.task_id] = result
    return list(results.values())


def run_repairs(results: list[ProblemResult]) -> dict[str, dict[str, tuple[int, int]]]:
    """Episodes: (first answers that failed, of them repaired by the last turn) per problem of
    each run made turn by turn ("greedy", "sampled"): the counts a repair rate is paired on."""
    runs = {
        "greedy": {
            r.task_id: (int(not r.greedy_turn_passed[0]),
                        int(not r.greedy_turn_passed[0] and r.greedy_turn_passed[-1]))
            for r in results
            if r.greedy_turn_passed
        },
        "sampled": {
            r.task_id: (r.failed_first, r.repaired)
            for r in results
            if r.failed_first is not None and r.repaired is not None
        },
    }  # fmt: skip
    return {run: repairs for run, repairs in runs.items() if repairs}


def run_counts(results: list[ProblemResult]) -> dict[str, dict[str, tuple[int, int]]]:
    """(samples, passed) per problem of each run made ("greedy", "sampled"): the counts the
    paired tests take."""
    runs = {
        "greedy": {
            r.task_id: (1, int(r.greedy_passed)) for r in results if r.greedy_passed is not None
        },
        "sampled": {
            r.task_id: (r.n, r.passed) for r in results if r.n is not None and r.passed is not None
        },
    }
    return {run: counts for run, counts in runs.items() if counts}
