"""``codepost run``: the whole post-training pipeline as a Prefect flow, with no server to start
(Prefect's ephemeral mode), from the embedded default or a YAML config."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2


def register_run(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="run the whole pipeline (SFT, RL, DPO, evaluation after each) as a Prefect flow",
        description="Run the post-train flow with no server to start. Without --config: the "
        "embedded default (SmolLM2-135M on the CPU, MBPP training problems, HumanEval "
        "evaluation, small settings). A run folder that exists resumes after its last "
        "finished stage.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of PostTrainConfig settings")
    parser.add_argument("--run-dir", help="the run folder (default runs/post-train)")
    parser.set_defaults(func=run)
    return parser


def load_config(path: Path | None, run_dir: str | None) -> Any:
    import yaml

    from codepost.pipeline.post_train import PostTrainConfig, embedded_default

    if path is None:
        config = embedded_default()
    else:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of PostTrainConfig settings")
        config = PostTrainConfig.model_validate(data)
    return config.model_copy(update={"run_dir": run_dir}) if run_dir else config


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rich.console import Console

    err = Console(stderr=True)
    try:
        config = load_config(args.config, args.run_dir)
    except (ValidationError, ValueError, OSError) as exc:
        err.print(f"[red]codepost run: invalid settings[/red]: {exc}")
        return EXIT_BAD_INPUT
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "codepost")
    from codepost.flows.post_train import post_train

    result = post_train(config)
    from rich.table import Table

    from codepost.pipeline.post_train import pass_at_1_rows

    table = Table(title=f"greedy pass@1 per stage ({config.run_dir})")
    for column in ("stage", "greedy pass@1", "passed", "problems", "checkpoint"):
        table.add_column(column)
    for row in pass_at_1_rows(result["evaluations"]):
        table.add_row(
            row["stage"],
            f"{row['greedy pass@1']:.4f}",
            str(row["passed"]),
            str(row["problems"]),
            row["checkpoint"],
        )
    console = Console()
    console.print(table)
    console.print(f"report: {result['report']}")
    return 0
