"""Pipeline commands: ``codepost evaluate`` (pass@k of a checkpoint, through the sampler and
the sandboxed verifier, with its 95% interval; ``--compare A B`` tests whether two evaluations
differ by more than chance) and ``codepost checkpoints`` (the registry of a run folder).

Settings come from the stage's pydantic config: a YAML file (``--config``) and the flags,
flags winning; unknown YAML keys are refused with their name.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .command_line import (
    EXIT_BAD_INPUT,
    EXIT_SANDBOX_ERRORS,
    EXIT_SANDBOX_UNAVAILABLE,
    read_settings,
    stdout_console,
)

if TYPE_CHECKING:
    from .reporting.evaluations import EvaluationResults
    from .reporting.report import Evaluation


def register_evaluate(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "evaluate",
        help="pass@k of a checkpoint (greedy pass@1, sampled pass@k) in the sandbox",
        description="Sample completions of a checkpoint for every problem, run them in the "
        "Docker sandbox, and report greedy pass@1 and sampled pass@k (unbiased estimator).",
    )
    parser.add_argument(
        "checkpoint",
        nargs="?",
        default="embedded:smollm2-135m-instruct",
        help="model folder, hub id or embedded:<name> (default: the embedded SmolLM2)",
    )
    parser.add_argument("--config", type=Path, help="YAML file of EvalConfig settings")
    parser.add_argument("--problems", help="'humaneval' (default), a .jsonl/.json file, a hub id")
    parser.add_argument("--split", help="train | validation | test | prompt | all")
    parser.add_argument("--limit", type=int, help="evaluate on the first N problems")
    parser.add_argument("--prompt-style", choices=["chat", "continuation"])
    parser.add_argument("--no-greedy", action="store_true", help="skip greedy pass@1")
    parser.add_argument("--samples", type=int, help="sampled completions per problem (n)")
    parser.add_argument("--temperature", type=float, help="of the sampled completions")
    parser.add_argument("--k", type=int, action="append", help="k of pass@k (repeatable)")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--backend", choices=["vllm", "hf"], help="sampling engine")
    parser.add_argument("--workers", type=int, help="sandbox containers")
    parser.add_argument("--exclude-sandbox-errors", action="store_true")
    parser.add_argument("--output", type=Path, default=Path("runs/evaluate"), help="folder")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="compare two evaluation folders on the same problems instead (runs no model): "
        "intervals, the difference B - A, exact McNemar (greedy), paired bootstrap (sampled)",
    )
    parser.set_defaults(func=evaluate)
    return parser


def build_config(args: argparse.Namespace) -> Any:
    """The EvalConfig of a YAML file (if any) with the flags given on top."""
    from .stages.evaluation import EvalConfig

    data = {} if args.config is None else read_settings(args.config, "EvalConfig")
    problems = dict(data.get("problems") or {})
    for flag, key in (("problems", "source"), ("split", "split"), ("limit", "limit")):
        if getattr(args, flag) is not None:
            problems[key] = getattr(args, flag)
    flags = {
        "prompt_style": args.prompt_style,
        "num_samples": args.samples,
        "temperature": args.temperature,
        "ks": args.k,
        "max_tokens": args.max_tokens,
    }
    data.update({key: value for key, value in flags.items() if value is not None})
    data["problems"] = problems
    if args.no_greedy:
        data["greedy"] = False
    if args.exclude_sandbox_errors:
        data["exclude_sandbox_errors"] = True
    if args.backend:
        data["engine"] = {**(data.get("engine") or {}), "backend": args.backend}
    if args.workers:
        data["scoring"] = {**(data.get("scoring") or {}), "workers": args.workers}
    if "ks" not in data and data.get("num_samples"):
        data["ks"] = [k for k in (1, 8) if k <= data["num_samples"]]
    return EvalConfig.model_validate(data)


def evaluate(args: argparse.Namespace) -> int:
    if args.compare:
        return compare(*args.compare)
    from pydantic import ValidationError
    from rich.console import Console
    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler()])
    err = Console(stderr=True)
    try:
        config = build_config(args)
    except (ValidationError, ValueError, OSError) as exc:
        err.print(f"[red]codepost evaluate: invalid settings[/red]: {exc}")
        return EXIT_BAD_INPUT

    from ..sandbox import SandboxUnavailable
    from ..verifiers import ProblemFormatError
    from .model_config import ModelNotFoundError
    from .stages.evaluation import run_evaluate

    try:
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
    from rich.table import Table

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
    """``codepost evaluate --compare A B``: is B better than A, or within chance? Both are
    read back from their folders' per-problem results; nothing is sampled or run."""
    from rich.console import Console
    from rich.markup import escape

    from .reporting.report import check_same_problems, load_evaluation

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
    for evaluation, name in ((before, "A"), (after, "B")):
        errors = {run: evaluation.results.sandbox_errors(run) for run in runs}
        if any(errors.values()):
            shown = ", ".join(f"{run} {n}" for run, n in errors.items() if n)
            console.print(f"{name} had sandbox errors ({shown}): counted as failures here")
    return 0


def _print_greedy_comparison(before: Evaluation, after: Evaluation, console: Any) -> None:
    from rich.table import Table

    from .reporting.report import format_p_value
    from .reporting.stats import compare_greedy, wilson_interval

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
    from rich.table import Table

    from .reporting.report import format_p_value
    from .reporting.stats import bootstrap_interval, compare_sampled, pass_at_k_per_problem

    a, b = before.counts["sampled"], after.counts["sampled"]
    fewest = min(n for counts in (a, b) for n, _ in counts.values())
    ks = sorted(set(_ks(before.results)) & set(_ks(after.results)))
    settings = [
        f"{name}: n={max(n for n, _ in counts.values())}, T={_temperature(evaluation.results):g}"
        for name, evaluation, counts in (("A", before, a), ("B", after, b))
    ]
    table = Table(
        title="sampled pass@k (95% bootstrap interval over problems; paired bootstrap test)",
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


def register_checkpoints(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "checkpoints",
        help="list, show, verify, tag and prune the checkpoints of a run folder",
        description="The checkpoint registry of a run folder: every published checkpoint "
        "(model folder + manifest.json) under it is a version.",
    )
    parser.add_argument("--root", type=Path, default=Path("runs"), help="the run folder")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every version, oldest first, with stage, tags, metrics")
    actions.add_parser("show", help="a version's manifest").add_argument(
        "ref", help="tag, folder or stage/version"
    )
    actions.add_parser("verify", help="check file hashes against the manifest").add_argument(
        "ref", nargs="?", help="tag, folder or stage/version (default: every version)"
    )
    tag = actions.add_parser("tag", help="point a tag (best, production, ...) at a version")
    tag.add_argument("ref")
    tag.add_argument("name")
    prune = actions.add_parser("prune", help="delete all but the newest K and the tagged ones")
    prune.add_argument("--keep-last", type=int, required=True)
    prune.add_argument("--dry-run", action="store_true")
    parser.set_defaults(func=checkpoints)
    return parser


def checkpoints(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .atomic import WriteError
    from .checkpoints import registry
    from .checkpoints.manifest import verify

    console, err = stdout_console(), Console(stderr=True)
    try:
        if args.action == "list":
            table = Table(title=f"checkpoints under {args.root}")
            table.add_column("version", no_wrap=True)  # what `tag` and `verify` take
            for column in ("tags", "parent", "created", "key metrics"):
                table.add_column(column)
            for entry in registry.list_checkpoints(args.root):
                table.add_row(
                    entry.name,
                    ", ".join(entry.tags),
                    Path(entry.manifest.parent or "").name,
                    entry.manifest.created_at,
                    _key_metrics(entry.manifest.metrics),
                )
            console.print(table)
        elif args.action == "show":
            entry = registry.resolve(args.root, args.ref)
            console.print_json(entry.manifest.model_dump_json())
        elif args.action == "verify":
            entries = (
                [registry.resolve(args.root, args.ref)]
                if args.ref
                else registry.list_checkpoints(args.root)
            )
            failed = 0
            for entry in entries:
                problems = verify(entry.path)
                for problem in problems:
                    err.print(f"[red]{entry.name}[/red]: {problem}")
                failed += bool(problems)
                if not problems:
                    console.print(f"{entry.name}: {len(entry.manifest.files)} files match")
            if failed:
                return 1
        elif args.action == "tag":
            entry = registry.tag(args.root, args.ref, args.name)
            console.print(f"{args.name} -> {entry.name} ({entry.path})")
        elif args.action == "prune":
            doomed = registry.prune(args.root, args.keep_last, dry_run=args.dry_run)
            verb = "would delete" if args.dry_run else "deleted"
            console.print(f"{verb} {len(doomed)}: {', '.join(e.name for e in doomed) or '-'}")
    except (LookupError, ValueError, FileNotFoundError) as exc:
        err.print(f"[red]codepost checkpoints[/red]: {exc}")
        return EXIT_BAD_INPUT
    except WriteError as exc:  # a full disk, a read-only folder: named, not a traceback
        err.print(f"[red]codepost checkpoints[/red]: {exc}")
        return 1
    return 0


def _key_metrics(metrics: dict[str, Any]) -> str:
    from .rl.metric_names import Reward, lookup

    shown = {name: lookup(metrics, name) for name in (Reward.MEAN, Reward.PASS_RATE)}
    shown |= {name: metrics.get(name) for name in ("train_loss", "pass@1")}
    return ", ".join(
        f"{name} {value:.3f}" for name, value in shown.items() if isinstance(value, float)
    )
