"""``codepost run``: the whole post-training pipeline as a Prefect flow, with no server to start
(Prefect's ephemeral mode), from the embedded default or a YAML config. ``codepost serve``:
the deployments (nightly ``post-train``, every stage on demand) served against a server."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..pipeline.cli import (
    EXIT_BAD_INPUT,
    EXIT_SANDBOX_UNAVAILABLE,
    read_settings,
    stdout_console,
)


def register_run(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="run the whole pipeline (SFT, RL, DPO, evaluation after each) as a Prefect flow",
        description="Run the post-train flow with no server to start. Without --config: the "
        "embedded default (SmolLM2-135M on the CPU, MBPP training problems, HumanEval "
        "evaluation, small settings). A run folder that exists resumes: every finished stage "
        "whose config, inputs and code are unchanged is reused.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of PostTrainConfig settings")
    parser.add_argument("--run-dir", help="the run folder (default runs/post-train)")
    parser.add_argument(
        "--num-processes",
        type=_positive,
        help="processes for each rank-aware stage (sft, rl, update, dpo), one per GPU, through "
        "`accelerate launch`, DDP (launch.accelerate_config in --config sets machines and GPUs); "
        "the other stages run in this process (default: launch.num_processes, 1)",
    )
    parser.add_argument(
        "--report-to",
        nargs="+",
        metavar="TRACKER",
        help="experiment trackers that get the run's config, metrics and report "
        "(tensorboard, mlflow, wandb, trackio; default: the config's report_to, none)",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--quiet", action="store_true", help="show warnings, errors and the result only"
    )
    shown.add_argument("--verbose", action="store_true", help="show every library's INFO lines too")
    parser.set_defaults(func=run)
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def load_config(
    path: Path | None,
    run_dir: str | None,
    num_processes: int | None = None,
    report_to: list[str] | None = None,
) -> Any:
    """The run's config, from ``path`` or the embedded default, with the command's overrides."""
    from ..pipeline.post_train import PostTrainConfig, embedded_default

    config = (
        embedded_default()
        if path is None
        else PostTrainConfig.model_validate(read_settings(path, "PostTrainConfig"))
    )
    if run_dir:
        config = config.model_copy(update={"run_dir": run_dir})
    if num_processes is not None:
        launch = config.launch.model_copy(update={"num_processes": num_processes})
        config = config.model_copy(update={"launch": launch})
    if report_to is not None:  # validated: a tracker's name is checked like the file's
        config = PostTrainConfig.model_validate({**config.model_dump(), "report_to": report_to})
    return config


def _route_logs() -> None:
    """Before prefect and trl load: codepost's loggers reach the flow run's logs, and vLLM keeps
    its INFO lines (engine settings, KV cache size) for the run's log files, which importing TRL
    turns to ERROR in this process and in the stage workers it starts (the terminal shows them
    with --verbose only: flows/terminal.py). Settings the user made win."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "codepost")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rich.console import Console

    from .ephemeral import allow_a_slow_first_start

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    allow_a_slow_first_start()
    _route_logs()
    from ..pipeline.run_lock import RunFolderLocked, run_folder_lock

    err = Console(stderr=True)
    try:
        config = load_config(args.config, args.run_dir, args.num_processes, args.report_to)
        config.model.resolve()  # a missing model is found before Prefect starts
    except (ValidationError, ValueError, OSError) as exc:
        err.print(f"[red]codepost run: invalid settings[/red]: {exc}")
        return EXIT_BAD_INPUT
    from ..pipeline.config_walk import settings_of
    from ..pipeline.inference.sampling import EngineConfig
    from ..pipeline.inference.server import check_server
    from ..pipeline.stages.scoring import SandboxSettings, check_sandbox
    from ..sandbox import SandboxUnavailable

    try:
        for sandbox in settings_of(config, SandboxSettings):  # every engine the run scores on
            check_sandbox(sandbox)
    except SandboxUnavailable as exc:
        err.print(f"[red]codepost run: the sandbox is unavailable[/red]: {exc}")
        return EXIT_SANDBOX_UNAVAILABLE
    try:
        for engine in settings_of(config, EngineConfig):
            if engine.server_url is not None:
                check_server(engine.server_url)
    except (ConnectionError, RuntimeError) as exc:
        err.print(f"[red]codepost run: a sample server is unavailable[/red]: {exc}")
        return EXIT_BAD_INPUT
    try:
        with run_folder_lock(Path(config.run_dir)):
            pass  # refused at once, not after Prefect has started; the run takes it again
    except RunFolderLocked as exc:
        err.print(f"[red]codepost run[/red]: {exc}")
        return EXIT_BAD_INPUT
    from .ephemeral import EphemeralServerError, start_ephemeral_server
    from .post_train import post_train
    from .terminal import Verbosity, terminal

    try:
        start_ephemeral_server()  # stopped with this process, even a SIGKILLed one
    except EphemeralServerError as exc:
        err.print(f"[red]codepost run[/red]: {exc}")
        return EXIT_BAD_INPUT
    verbosity: Verbosity = "quiet" if args.quiet else "verbose" if args.verbose else "normal"
    with terminal(Path(config.run_dir), verbosity):
        state = post_train(config, return_state=True)
    if not state.is_completed():  # Prefect has logged the traceback
        err.print(
            f"[red]codepost run: {state.message}[/red]\nFinished stages are kept in "
            f"{config.run_dir}: the same command resumes after the last one."
        )
        return 1
    result = state.result()
    from rich.table import Table

    from ..pipeline.reporting.report import format_p_value

    table = Table(title=f"greedy pass@1 per stage ({config.run_dir})")
    for column in ("benchmark", "stage", "pass@1", "95% CI", "passed", "p vs prev", "p vs base"):
        table.add_column(column)
    for row in result["rows"]:
        if row["greedy pass@1"] is None:  # a benchmark evaluated with samples only: the report
            continue
        table.add_row(
            row["benchmark"],
            row["stage"],
            f"{row['greedy pass@1']:.4f}",
            f"[{row['ci95 low']:.3f}, {row['ci95 high']:.3f}]",
            f"{row['passed']}/{row['problems']}",
            *(
                "" if row[f"p vs {other}"] is None else format_p_value(row[f"p vs {other}"])
                for other in ("previous", "base")
            ),
        )
    console = stdout_console()
    console.print(table)
    console.print(f"report: {result['report']}")
    return 0


def register_serve(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="serve the deployments (nightly post-train, every stage on demand) to a Prefect server",
        description="Register and serve the deployments against the Prefect server in "
        "PREFECT_API_URL (start one with `prefect server start`). Runs triggered from the UI "
        "or the API, and the nightly schedule's, execute in this process.",
    )
    parser.add_argument("--cron", default="0 2 * * *", help="post-train's schedule (cron)")
    parser.add_argument("--timezone", default="UTC")
    parser.add_argument(
        "--accelerator-slots", type=int, default=1, help="accelerator-bound tasks at once"
    )
    parser.set_defaults(func=serve)
    return parser


def serve(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not os.environ.get("PREFECT_API_URL"):
        Console(stderr=True).print(
            "[red]codepost serve[/red]: PREFECT_API_URL is not set; start a server "
            "(`prefect server start --host 127.0.0.1`) and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
        return EXIT_BAD_INPUT
    _route_logs()
    from .serve import serve_forever

    serve_forever(args.cron, args.timezone, args.accelerator_slots)
    return 0
