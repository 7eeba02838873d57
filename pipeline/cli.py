"""``codepost evaluate``: pass@k of a checkpoint, through the sampler and the sandboxed verifier.

Settings come from the stage's pydantic config: a YAML file (``--config``) and the flags below,
flags winning; unknown YAML keys are refused with their name.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_SANDBOX_UNAVAILABLE = 3
EXIT_SANDBOX_ERRORS = 4


def register(subparsers: Any) -> argparse.ArgumentParser:
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
    parser.set_defaults(func=run)
    return parser


def build_config(args: argparse.Namespace) -> Any:
    """The EvalConfig of a YAML file (if any) with the flags given on top."""
    import yaml

    from codepost.pipeline.evaluation import EvalConfig

    data: dict[str, Any] = {}
    if args.config is not None:
        data = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{args.config}: expected a mapping of EvalConfig settings")
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


def run(args: argparse.Namespace) -> int:
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

    from codepost.pipeline.evaluation import run_evaluate
    from codepost.pipeline.model_config import ModelNotFoundError
    from codepost.sandbox import SandboxUnavailable
    from codepost.verifiers import ProblemFormatError

    try:
        results = run_evaluate(config, args.checkpoint, args.output)
    except (ModelNotFoundError, ProblemFormatError, FileNotFoundError) as exc:
        err.print(f"[red]codepost evaluate[/red]: {exc}")
        return EXIT_BAD_INPUT
    except SandboxUnavailable as exc:
        err.print(f"[red]codepost evaluate: the sandbox is unavailable[/red]: {exc}")
        return EXIT_SANDBOX_UNAVAILABLE
    print_table(results, Console())
    Console().print(f"results: {args.output / 'evaluation.json'}")
    errors = sum(results.get(run, {}).get("sandbox_errors", 0) for run in ("greedy", "sampled"))
    return EXIT_SANDBOX_ERRORS if errors else 0


def print_table(results: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{results['checkpoint']} on {results['num_problems']} problems")
    for column in ("run", "metric", "value", "samples", "passed", "sandbox errors"):
        table.add_column(column)
    for run in ("greedy", "sampled"):
        if run not in results:
            continue
        scores = results[run]
        for key, value in scores.items():
            if key.startswith("pass@"):
                shown = "n/a" if math.isnan(value) else f"{value:.4f}"
                table.add_row(
                    f"{run} (T={scores['temperature']:g})",
                    key,
                    shown,
                    str(scores["samples"]),
                    str(scores["passed"]),
                    str(scores["sandbox_errors"]),
                )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """``python -m codepost.pipeline.cli evaluate ...``"""
    parser = argparse.ArgumentParser(prog="python -m codepost.pipeline.cli")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
