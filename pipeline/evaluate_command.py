"""``codepost evaluate``: pass@k of a checkpoint, through the sampler and the sandboxed
verifier, with its 95% interval; ``--compare A B`` tests whether two evaluations differ by more
than chance.

Settings are the evaluation stage's config (:class:`EvalConfig`): a YAML file (``--config``)
and a flag for each field, flags winning (:mod:`..settings.config`).
"""

from __future__ import annotations

import argparse
import logging
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from ..sandbox import SandboxUnavailable
from ..settings.command_line import (
    EXIT_BAD_INPUT,
    EXIT_SANDBOX_ERRORS,
    EXIT_SANDBOX_UNAVAILABLE,
    refuse,
    settings_command,
    stdout_console,
)
from ..settings.config import load_config
from ..verifiers import ProblemFormatError
from .data.problem_sets import check_problem_files
from .model_config import DEFAULT_MODEL, ModelNotFoundError, check_model
from .progress import shown_on
from .reporting.evaluations import EvaluationResults
from .reporting.report import Evaluation, check_same_problems, format_p_value, load_evaluation
from .reporting.stats import (
    bootstrap_interval,
    compare_greedy,
    compare_sampled,
    pass_at_k_per_problem,
    sign_flip_p_value,
    wilson_interval,
)
from .stages.evaluation import EvalConfig, run_evaluate


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = settings_command(
        subparsers,
        "evaluate",
        EvalConfig,
        example="--problems.source mbpp --problems.split test --sampling.max-tokens 256",
        help="pass@k of a checkpoint (greedy pass@1, sampled pass@k) in the sandbox",
        description="Sample completions of a checkpoint for every problem, run them in the "
        "Docker sandbox, and report greedy pass@1 and sampled pass@k (unbiased estimator).",
    )
    parser.add_argument(
        "checkpoint",
        nargs="?",
        default=DEFAULT_MODEL,
        help="model folder, hub id or embedded:<name> (default: the embedded SmolLM2)",
    )
    parser.add_argument("--output", type=Path, default=Path("runs/evaluate"), help="folder")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="compare two evaluation folders on the same problems instead (runs no model): "
        "intervals, the difference B - A, exact McNemar (greedy), sign-flip test (sampled), "
        "from each folder's evaluation.json and per_problem.jsonl",
    )
    parser.set_defaults(func=evaluate)
    return parser


def evaluate(args: argparse.Namespace) -> int:
    if args.compare:
        return compare(*args.compare)
    err = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=err)]
    )
    try:
        config = load_config(EvalConfig, args.config, args.settings)
        check_model(args.checkpoint)  # a hub id out of reach, before the sandbox starts
        check_problem_files(config)  # a misspelt problem set, a malformed file
    except (ValueError, OSError) as exc:
        return refuse("evaluate", "invalid settings", exc)
    try:
        with shown_on(err):  # live bars on a terminal, else a line every 10 s
            results = run_evaluate(config, args.checkpoint, args.output)
    except (ModelNotFoundError, ProblemFormatError, FileNotFoundError) as exc:
        err.print(f"[red]codepost evaluate[/red]: {exc}")
        return EXIT_BAD_INPUT
    except SandboxUnavailable as exc:
        err.print(f"[red]codepost evaluate: the sandbox is unavailable[/red]: {exc}")
        return EXIT_SANDBOX_UNAVAILABLE
    console = stdout_console()
    print_table(results, console)
    console.print(f"results: {args.output / 'evaluation.json'}")
    return EXIT_SANDBOX_ERRORS if results.sandbox_errors() else 0


def print_table(results: EvaluationResults, console: Any) -> None:
    """The scores of an evaluation, each with its 95% interval."""
    table = Table(title=f"{results.checkpoint} on {results.num_problems} problems")
    for column in ("run", "metric", "value", "95% CI", "samples", "passed", "sandbox errors"):
        table.add_column(column)
    for name, run in results.runs().items():
        for k, value in run.pass_at_k.items():
            table.add_row(
                f"{name} (T={run.temperature:g})",
                f"pass@{k}",
                "n/a" if math.isnan(value) else f"{value:.4f}",
                _interval(run.ci95.get(k)),
                str(run.samples),
                str(run.passed),
                str(run.sandbox_errors),
            )
    console.print(table)


def compare(a: Path, b: Path) -> int:
    """``codepost evaluate --compare A B``: is B better than A, or within chance? Every
    number is computed from the two folders' ``evaluation.json`` and ``per_problem.jsonl``;
    nothing is sampled or run."""
    err = Console(stderr=True)
    try:
        before, after = load_evaluation(a), load_evaluation(b)
        check_same_problems(before, after)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]codepost evaluate --compare[/red]: {escape(str(exc))}")
        return EXIT_BAD_INPUT
    runs = [run for run in ("greedy", "sampled") if run in before.counts and run in after.counts]
    if not runs:
        err.print(
            f"[red]codepost evaluate --compare[/red]: no run in common: {before.folder} has "
            f"{', '.join(before.counts) or 'none'}, {after.folder} has "
            f"{', '.join(after.counts) or 'none'}"
        )
        return EXIT_BAD_INPUT
    console = stdout_console()
    console.print(
        f"A: {before.folder} ({before.results.checkpoint})\n"
        f"B: {after.folder} ({after.results.checkpoint})\n"
        f"on the same {len(before.tasks)} problems"
    )
    if "greedy" in runs:
        _print_greedy_comparison(before, after, console)
    if "sampled" in runs:
        _print_sampled_comparison(before, after, console)
    _print_repair_comparison(before, after, console)
    for evaluation, name in ((before, "A"), (after, "B")):
        errors = {run: evaluation.results.sandbox_errors(run) for run in runs}
        if any(errors.values()):
            shown = ", ".join(f"{run} {n}" for run, n in errors.items() if n)
            console.print(f"{name} had sandbox errors ({shown}): counted as failures here")
    return 0


def _print_greedy_comparison(before: Evaluation, after: Evaluation, console: Any) -> None:

    greedy_before, greedy_after = before.greedy(), after.greedy()
    assert greedy_before is not None and greedy_after is not None  # "greedy" in both runs
    result = compare_greedy(greedy_before, greedy_after)
    table = Table(title="greedy pass@1 (95% Wilson interval; exact McNemar test)")
    for column in ("A", "A 95% CI", "B", "B 95% CI", "B - A", "gained", "lost", "p"):
        table.add_column(column)
    n = result.problems
    table.add_row(
        f"{result.before_passed / n:.4f} ({result.before_passed}/{n})",
        _interval(wilson_interval(result.before_passed, n)),
        f"{result.after_passed / n:.4f} ({result.after_passed}/{n})",
        _interval(wilson_interval(result.after_passed, n)),
        f"{result.difference:+.4f}",
        str(result.gained),
        str(result.lost),
        format_p_value(result.p_value),
    )
    console.print(table)
    console.print(
        f"gained: {result.gained} problems failed by A and solved by B; lost: {result.lost} "
        "solved by A and failed by B. p < 0.05: a difference unlikely under chance alone."
    )


def _print_sampled_comparison(before: Evaluation, after: Evaluation, console: Any) -> None:

    a, b = before.counts["sampled"], after.counts["sampled"]
    fewest = min(n for counts in (a, b) for n, _ in counts.values())
    ks = sorted(set(_ks(before.results)) & set(_ks(after.results)))
    settings = [
        f"{name}: n={max(n for n, _ in counts.values())}, T={_temperature(evaluation.results):g}"
        for name, evaluation, counts in (("A", before, a), ("B", after, b))
    ]
    table = Table(
        title="sampled pass@k (95% bootstrap interval over problems; sign-flip test)",
        caption="; ".join(settings),
    )
    for column in ("k", "A", "A 95% CI", "B", "B 95% CI", "B - A", "B - A 95% CI", "p"):
        table.add_column(column)
    for k in ks:
        if k > fewest:
            console.print(f"sampled pass@{k}: some problem has fewer than {k} samples, left out")
            continue
        result = compare_sampled(a, b, k)
        table.add_row(
            str(k),
            f"{result.before:.4f}",
            _interval(bootstrap_interval(pass_at_k_per_problem(a, k))),
            f"{result.after:.4f}",
            _interval(bootstrap_interval(pass_at_k_per_problem(b, k))),
            f"{result.difference:+.4f}",
            _interval(result.difference_ci95, signed=True),
            format_p_value(result.p_value),
        )
    if table.row_count:
        console.print(table)
    else:
        console.print("sampled: no pass@k that both evaluations report")


def _print_repair_comparison(before: Evaluation, after: Evaluation, console: Any) -> None:
    """Episodes: each run's repair rate (turn-1 failures passing by the last turn), paired on
    the problems where both checkpoints failed some first answer: the per-problem rates'
    difference, its bootstrap interval and the sign-flip test."""
    runs = [run for run in ("greedy", "sampled") if run in before.repairs and run in after.repairs]
    if not runs:
        return
    table = Table(title="repair rate over turns (problems both failed at turn 1; sign-flip test)")
    for column in ("run", "problems", "A", "B", "B - A", "B - A 95% CI", "p"):
        table.add_column(column)
    for run in runs:
        a, b = before.repairs[run], after.repairs[run]
        tasks = sorted(t for t in a.keys() & b.keys() if a[t][0] and b[t][0])
        if not tasks:
            console.print(f"{run}: no problem whose first answer failed under both")
            continue
        differences = [Fraction(b[t][1], b[t][0]) - Fraction(a[t][1], a[t][0]) for t in tasks]
        table.add_row(
            run,
            str(len(tasks)),
            f"{sum(a[t][1] for t in tasks)}/{sum(a[t][0] for t in tasks)}",
            f"{sum(b[t][1] for t in tasks)}/{sum(b[t][0] for t in tasks)}",
            f"{float(sum(differences) / len(tasks)):+.4f}",
            _interval(
                bootstrap_interval(dict(zip(tasks, map(float, differences), strict=True))),
                signed=True,
            ),
            format_p_value(sign_flip_p_value(differences)),
        )
    if table.row_count:
        console.print(table)


def _ks(results: EvaluationResults) -> list[int]:
    """The k of each sampled pass@k an evaluation reported."""
    return list(results.sampled.pass_at_k) if results.sampled else []


def _temperature(results: EvaluationResults) -> float:
    return results.sampled.temperature if results.sampled else math.nan


def _interval(interval: Any, *, signed: bool = False) -> str:
    if not interval:
        return "n/a"
    low, high = interval
    return f"[{low:+.4f}, {high:+.4f}]" if signed else f"[{low:.4f}, {high:.4f}]"
