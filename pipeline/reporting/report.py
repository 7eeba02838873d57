"""The report of a post-training run, and the evaluation folders it is made of read back.

A pass@1 that moved by two problems out of 164 is noise more often than progress: the report
gives each stage's greedy pass@1 with its 95% Wilson interval and compares it, problem by
problem, with the stage before and with the base model (exact McNemar test). A benchmark
evaluated with samples gets a second table: sampled pass@1 with its bootstrap interval over
problems, and its difference with the stage before and the base (a paired bootstrap interval,
the sign-flip test's p). The per-problem data comes from each evaluation folder's
``per_problem.jsonl``; sandbox errors count as failures, as a paired test needs every problem
scored on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_text
from .evaluations import (
    PER_PROBLEM_FILE,
    RESULTS_FILE,
    SAMPLES_FILE,
    EvaluationResults,
    ProblemResult,
    per_problem_results,
    read_per_problem,
    run_counts,
    run_repairs,
)
from .plots import plot_curves
from .stats import (
    GreedyComparison,
    bootstrap_interval,
    compare_greedy,
    compare_sampled,
    pass_at_k_per_problem,
    wilson_interval,
)

REPORT_FILE = "report.md"
PASS_PLOT_FILE = "pass_at_1.png"
EVALUATIONS_FILE = "evaluations.json"
RL_CURVES = "rl/reward_curve.png"


class ProblemsDiffer(ValueError):
    """Two evaluations on different problems: a paired comparison of them means nothing."""


@dataclass(frozen=True)
class Evaluation:
    """An evaluation folder read back: ``evaluation.json`` and, per run ("greedy",
    "sampled"), the (samples, passed) counts of each problem from ``per_problem.jsonl``."""

    folder: Path
    results: EvaluationResults
    counts: dict[str, dict[str, tuple[int, int]]]
    # episodes: (first answers failed, repaired) per problem of each run made turn by turn
    repairs: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @property
    def tasks(self) -> set[str]:
        return {task for counts in self.counts.values() for task in counts}

    def greedy(self) -> dict[str, bool] | None:
        """Whether each problem's greedy completion passed; None without a greedy run."""
        counts = self.counts.get("greedy")
        return None if counts is None else {task: c > 0 for task, (_, c) in counts.items()}


def load_evaluation(path: Path) -> Evaluation:
    """The evaluation in folder ``path`` (or of its ``evaluation.json``); FileNotFoundError
    names the file missing, ValueError a per-problem file that lacks a run the results have."""
    path = Path(path)
    folder = path.parent if path.name == RESULTS_FILE else path
    results_file = folder / RESULTS_FILE
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file}: no such file (not an evaluation folder?)")
    results = EvaluationResults.read(results_file)
    problems, source = _problem_results(folder)
    counts = run_counts(problems)
    for run in results.runs():
        if len(counts.get(run, {})) != len(problems):
            raise ValueError(
                f"{source}: {len(problems) - len(counts.get(run, {}))} of {len(problems)} "
                f"problems have no {run} result, though {results_file} has a {run} run"
            )
    return Evaluation(folder=folder, results=results, counts=counts, repairs=run_repairs(problems))


def _problem_results(folder: Path) -> tuple[list[ProblemResult], Path]:
    """The per-problem results of an evaluation folder and the file they came from: those
    written before ``per_problem.jsonl`` existed are counted from ``samples.jsonl``."""
    per_problem, samples = folder / PER_PROBLEM_FILE, folder / SAMPLES_FILE
    if per_problem.is_file():
        return read_per_problem(per_problem), per_problem
    if samples.is_file():
        with samples.open() as stream:
            rows = [json.loads(line) for line in stream if line.strip()]
        return per_problem_results(rows), samples
    raise FileNotFoundError(f"{per_problem}: no such file (nor {SAMPLES_FILE} to count from)")


def check_same_problems(a: Evaluation, b: Evaluation) -> None:
    """Raise ProblemsDiffer, naming both folders and what differs, unless ``a`` and ``b``
    were evaluated on the same problems (task ids, and content where both have its hash)."""
    only_a, only_b = sorted(a.tasks - b.tasks), sorted(b.tasks - a.tasks)
    if only_a or only_b:
        raise ProblemsDiffer(
            f"{a.folder} and {b.folder} were evaluated on different problems: "
            f"{len(only_a)} only in {a.folder}{_examples(only_a)}, "
            f"{len(only_b)} only in {b.folder}{_examples(only_b)}"
        )
    fingerprints = (a.results.problems_fingerprint, b.results.problems_fingerprint)
    if None not in fingerprints and fingerprints[0] != fingerprints[1]:
        raise ProblemsDiffer(
            f"{a.folder} and {b.folder} have the same task ids but different problems "
            f"(problems_fingerprint {fingerprints[0]} vs {fingerprints[1]}): their prompts, "
            "tests or order differ"
        )


StartedFrom = Mapping[str, str | None]  # stage -> the stage whose checkpoint it trained from


def stage_rows(
    evaluations: dict[str, dict[str, Path]], started_from: StartedFrom | None = None
) -> list[dict[str, Any]]:
    """One row per (benchmark, stage) of ``evaluations`` (benchmark -> stage -> evaluation
    folder, stages in order): greedy pass@1 with its 95% Wilson interval, and the paired
    comparison with the previous stage and with the first (None for the first). The previous
    stage is the one whose checkpoint it started from where ``started_from`` says (an arm
    that branches ``after:`` an earlier stage), else the one before it. Plain JSON-able
    values, for a table artifact."""
    return _rows(_load(evaluations), started_from)


def write_report(
    run_dir: Path,
    evaluations: dict[str, dict[str, Path]],
    started_from: StartedFrom | None = None,
) -> Path:
    """``report.md`` (a table per benchmark, the plots), ``pass_at_1.png`` and
    ``evaluations.json`` (the rows and every evaluation's results) in ``run_dir``."""
    run_dir = Path(run_dir)
    loaded = _load(evaluations)
    rows = _rows(loaded, started_from)
    sampled = _sampled_rows(loaded, started_from)
    run_dir.mkdir(parents=True, exist_ok=True)
    _plot(rows, sampled, run_dir / PASS_PLOT_FILE)
    lines = [
        "# Post-training run",
        "",
        "Greedy pass@1 with its 95% Wilson interval. Each stage is compared with the previous "
        "one (the stage whose checkpoint it started from) and with the first on the same "
        "problems: Δ in pass@1, +problems gained/-lost, and the exact McNemar p (p < 0.05 "
        "marks a difference unlikely under chance alone).",
    ]
    for benchmark in evaluations:
        lines += ["", f"## {benchmark}"]
        greedy = [r for r in rows if r["benchmark"] == benchmark]
        if any(r["greedy pass@1"] is not None for r in greedy):
            lines += ["", *_table(greedy)]
        if by_samples := [r for r in sampled if r["benchmark"] == benchmark]:
            lines += ["", *_sampled_table(by_samples)]
    lines += ["", f"![pass@1 per stage]({PASS_PLOT_FILE})"]
    if (run_dir / RL_CURVES).is_file():
        lines += ["", f"![RL reward curve]({RL_CURVES})"]
    path = run_dir / REPORT_FILE
    write_text(path, "\n".join(lines) + "\n")
    everything = {
        "rows": rows,
        "sampled_rows": sampled,
        "evaluations": {
            benchmark: {
                stage: {"folder": str(evaluation.folder), "results": evaluation.results.to_json()}
                for stage, evaluation in stages.items()
            }
            for benchmark, stages in loaded.items()
        },
    }
    write_text(run_dir / EVALUATIONS_FILE, json.dumps(everything, indent=2) + "\n")
    return path


def _load(evaluations: Mapping[str, Mapping[str, Path]]) -> dict[str, dict[str, Evaluation]]:
    return {
        benchmark: {stage: load_evaluation(folder) for stage, folder in stages.items()}
        for benchmark, stages in evaluations.items()
    }


def _previous(
    stage: str, earlier: Mapping[str, Evaluation], started_from: StartedFrom | None
) -> Evaluation | None:
    """What ``stage`` is compared with as "previous": of the ``earlier`` stages' evaluations,
    that of the stage it started from where ``started_from`` names one, else the last."""
    if started_from is not None and stage in started_from:
        return earlier.get(started_from[stage] or "")
    return list(earlier.values())[-1] if earlier else None


def _rows(
    loaded: Mapping[str, Mapping[str, Evaluation]], started_from: StartedFrom | None
) -> list[dict[str, Any]]:
    rows = []
    for benchmark, stages in loaded.items():
        first: Evaluation | None = None
        earlier: dict[str, Evaluation] = {}
        for stage, evaluation in stages.items():
            previous = _previous(stage, earlier, started_from)
            greedy = evaluation.greedy()
            passed = None if greedy is None else sum(greedy.values())
            low, high = (
                (None, None)
                if passed is None or not greedy
                else wilson_interval(passed, len(greedy))
            )
            rows.append(
                {
                    "benchmark": benchmark,
                    "stage": stage,
                    "checkpoint": evaluation.results.checkpoint,
                    "greedy pass@1": passed / len(greedy)
                    if passed is not None and greedy
                    else None,
                    "ci95 low": low,
                    "ci95 high": high,
                    "passed": passed,
                    "problems": evaluation.results.num_problems,
                    "sandbox errors": evaluation.results.sandbox_errors("greedy"),
                    **_versus("previous", previous, evaluation),
                    **_versus("base", first, evaluation),
                }
            )
            first = evaluation if first is None else first
            earlier[stage] = evaluation
    return rows


def _sampled_rows(
    loaded: Mapping[str, Mapping[str, Evaluation]], started_from: StartedFrom | None
) -> list[dict[str, Any]]:
    """One row per (benchmark, stage) evaluated with samples: sampled pass@1 with its bootstrap
    interval, and the paired comparison with the previous such stage and the first."""
    rows = []
    for benchmark, stages in loaded.items():
        first: Evaluation | None = None
        earlier: dict[str, Evaluation] = {}
        for stage, evaluation in stages.items():
            counts = evaluation.counts.get("sampled")
            if not counts or evaluation.results.sampled is None:
                continue
            previous = _previous(stage, earlier, started_from)
            per_problem = pass_at_k_per_problem(counts, 1)
            low, high = bootstrap_interval(per_problem)
            rows.append(
                {
                    "benchmark": benchmark,
                    "stage": stage,
                    "checkpoint": evaluation.results.checkpoint,
                    "samples per problem": max(n for n, _ in counts.values()),
                    "temperature": evaluation.results.sampled.temperature,
                    "sampled pass@1": sum(per_problem.values()) / len(per_problem),
                    "ci95 low": low,
                    "ci95 high": high,
                    "problems": len(counts),
                    **_sampled_versus("previous", previous, evaluation),
                    **_sampled_versus("base", first, evaluation),
                }
            )
            first = evaluation if first is None else first
            earlier[stage] = evaluation
    return rows


def _sampled_versus(name: str, before: Evaluation | None, after: Evaluation) -> dict[str, Any]:
    """Sampled pass@1, ``after`` - ``before``: the paired bootstrap interval and the sign-flip
    test's p (None: nothing to compare)."""
    if before is None:
        return {f"{field} vs {name}": None for field in ("difference", "difference ci95", "p")}
    check_same_problems(before, after)
    result = compare_sampled(before.counts["sampled"], after.counts["sampled"], 1)
    return {
        f"difference vs {name}": result.difference,
        f"difference ci95 vs {name}": list(result.difference_ci95),
        f"p vs {name}": result.p_value,
    }


def _sampled_table(rows: list[dict[str, Any]]) -> list[str]:
    n, temperature = rows[0]["samples per problem"], rows[0]["temperature"]
    lines = [
        f"Sampled pass@1 ({n} samples per problem at temperature {temperature:g}) with its 95% "
        "bootstrap interval over problems; differences with a paired bootstrap interval and "
        "the sign-flip test's p, over problems.",
        "",
        "| stage | sampled pass@1 | 95% CI | problems | vs previous: Δ [95% CI], p "
        "| vs base: Δ [95% CI], p | checkpoint |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        versus = [
            ""
            if row[f"p vs {other}"] is None
            else (
                f"{row[f'difference vs {other}']:+.4f} "
                f"[{row[f'difference ci95 vs {other}'][0]:+.4f}, "
                f"{row[f'difference ci95 vs {other}'][1]:+.4f}], {_p_is(row[f'p vs {other}'])}"
            )
            for other in ("previous", "base")
        ]
        lines.append(
            f"| {row['stage']} | {row['sampled pass@1']:.4f} | "
            f"[{row['ci95 low']:.4f}, {row['ci95 high']:.4f}] | {row['problems']} | "
            f"{versus[0]} | {versus[1]} | `{row['checkpoint']}` |"
        )
    return lines


def _versus(name: str, before: Evaluation | None, after: Evaluation) -> dict[str, Any]:
    """The columns comparing ``after`` with ``before`` (None where there is nothing to
    compare)."""
    comparison: GreedyComparison | None = None
    outcomes = (None if before is None else before.greedy(), after.greedy())
    if before is not None and outcomes[0] and outcomes[1]:
        check_same_problems(before, after)
        comparison = compare_greedy(outcomes[0], outcomes[1])
    fields = ("difference", "gained", "lost", "p_value")
    return {
        f"{field.removesuffix('_value')} vs {name}": getattr(comparison, field, None)
        for field in fields
    }


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| stage | greedy pass@1 | 95% CI | passed/problems | vs previous: Δ, +gained/-lost, p "
        "| vs base: Δ, p | checkpoint |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["greedy pass@1"] is None:
            score = interval = passed = "no greedy run"
        else:
            score = f"{row['greedy pass@1']:.4f}"
            interval = f"[{row['ci95 low']:.4f}, {row['ci95 high']:.4f}]"
            passed = f"{row['passed']}/{row['problems']}"
        previous = base = ""
        if row["p vs previous"] is not None:
            previous = (
                f"{row['difference vs previous']:+.4f}, +{row['gained vs previous']}/"
                f"-{row['lost vs previous']}, {_p_is(row['p vs previous'])}"
            )
        if row["p vs base"] is not None:
            base = f"{row['difference vs base']:+.4f}, {_p_is(row['p vs base'])}"
        lines.append(
            f"| {row['stage']} | {score} | {interval} | {passed} | {previous} | {base} "
            f"| `{row['checkpoint']}` |"
        )
    errors = [f"{row['stage']} {row['sandbox errors']}" for row in rows if row["sandbox errors"]]
    if errors:
        lines += ["", f"Sandbox errors, counted as failures: {', '.join(errors)}."]
    return lines


def _plot(rows: list[dict[str, Any]], sampled: list[dict[str, Any]], path: Path) -> None:
    """pass@1 per stage, a line per benchmark, its 95% interval as error bars: greedy (Wilson)
    in one panel and, where there are samples, sampled (bootstrap) in another."""
    by_stage: dict[str, dict[str, Any]] = {}
    problems: dict[str, int] = {}
    panels: dict[str, list[str]] = {}
    for kind, kind_rows in (("greedy", rows), ("sampled", sampled)):
        for row in kind_rows:
            point = by_stage.setdefault(row["stage"], {"stage": row["stage"]})
            score = row[f"{kind} pass@1"]
            if score is None:
                continue
            series = row["benchmark"] if kind == "greedy" else f"{row['benchmark']} (sampled)"
            point[series], point[f"{series}_ci95"] = score, (row["ci95 low"], row["ci95 high"])
            problems.setdefault(row["benchmark"], row["problems"])
            names = panels.setdefault(f"{kind}, with its 95% interval", [])
            names += [] if series in names else [series]
    counts = ", ".join(f"{benchmark} {n}" for benchmark, n in problems.items())
    plot_curves(
        list(by_stage.values()),
        path,
        x="stage",
        panels=panels or {"greedy, with its 95% interval": []},
        title=f"pass@1 after each stage\n(problems: {counts})",
        error_bars=True,
        y_from_zero=True,
    )


def format_p_value(p_value: float) -> str:
    """A p-value to 4 decimals; below that, a bound (10,000 random sign patterns resolve no p
    below 1/10,001)."""
    return f"{p_value:.4f}" if p_value >= 1e-4 else "<0.0001"


def _p_is(p_value: float) -> str:
    shown = format_p_value(p_value)
    return f"p{shown}" if shown.startswith("<") else f"p={shown}"


def _examples(tasks: list[str]) -> str:
    return f" (e.g. {', '.join(tasks[:3])})" if tasks else ""
