"""The ``codepost run`` command: its settings checked, then every outside service it needs
(the Docker engines, a sample server) and the run folder's lock before Prefect starts, so that a
run that cannot finish is refused at once; then the ``post-train`` flow and its pass@1 table.
Imported by :mod:`.commands` once the environment Prefect and TRL read is set."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from ..pipeline.command_line import EXIT_BAD_INPUT, EXIT_SANDBOX_UNAVAILABLE, stdout_console
from ..pipeline.config_walk import settings_of
from ..pipeline.data.problem_sets import check_problem_files
from ..pipeline.inference.remote import check_server
from ..pipeline.inference.sampling import EngineConfig
from ..pipeline.post_train import PostTrainConfig, embedded_default
from ..pipeline.reporting.report import format_p_value
from ..pipeline.run_lock import RunFolderLocked, run_folder_lock
from ..pipeline.settings import load_config
from ..pipeline.stages.scoring import SandboxSettings, check_sandbox
from ..sandbox import SandboxUnavailable
from .ephemeral import EphemeralServerError, start_ephemeral_server
from .post_train import post_train
from .terminal import Verbosity, terminal


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        config = load_config(PostTrainConfig, args.config, args.settings, embedded_default())
        config.model.resolve()  # a missing model is found before Prefect starts
        check_problem_files(config)  # and a malformed problems file
    except (ValidationError, ValueError, OSError) as exc:
        err.print(f"[red]codepost run: invalid settings[/red]: {exc}")
        return EXIT_BAD_INPUT
    refused = _check_services(config, err)
    if refused:
        return refused
    with contextlib.ExitStack() as held:
        try:  # from before Prefect starts to the end, for the flow's run
            held.enter_context(run_folder_lock(Path(config.run_dir), for_inner_runs=True))
        except RunFolderLocked as exc:
            err.print(f"[red]codepost run[/red]: {exc}")
            return EXIT_BAD_INPUT
        return _run_flow(config, args, err)


def _run_flow(config: PostTrainConfig, args: argparse.Namespace, err: Console) -> int:
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
    _print_results(config, state.result())
    return 0


def _check_services(config: PostTrainConfig, err: Console) -> int:
    """The exit status refusing the run, naming the first service it lacks; 0: none."""
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
    return 0


def _print_results(config: PostTrainConfig, result: dict[str, Any]) -> None:
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
