"""The ``codepost run`` command: its settings checked, then every outside service it needs
(the model, the Docker engines, a sample server, the trackers) and the run folder's lock before
Prefect starts, so that a run that cannot finish is refused in seconds; then the ``post-train``
flow and its pass@1 table. Prefect, torch and TRL load only once all of that holds.
Imported by :mod:`.commands` once the environment Prefect and TRL read is set."""

from __future__ import annotations

import argparse
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.table import Table

from ..pipeline.checkpoints.manifest import is_published, verified
from ..pipeline.data.problem_sets import check_problem_files
from ..pipeline.inference.remote import check_server
from ..pipeline.inference.sampling import EngineConfig
from ..pipeline.post_train import PostTrainConfig, embedded_default
from ..pipeline.reporting.report import format_p_value
from ..pipeline.run_lock import RunFolderLocked, run_folder_lock
from ..pipeline.stages.scoring import SandboxSettings, check_sandbox
from ..pipeline.tracking import TRACKERS, TrackerUnavailable
from ..sandbox import SandboxUnavailable
from ..settings.command_line import (
    EXIT_SANDBOX_UNAVAILABLE,
    refuse,
    stderr_console,
    stdout_console,
)
from ..settings.config import load_config
from ..settings.walk import settings_of
from .ephemeral import EphemeralServerError, start_ephemeral_server

if TYPE_CHECKING:
    from .terminal import Verbosity


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(PostTrainConfig, args.config, args.settings, embedded_default())
    except (ValueError, OSError) as exc:
        return refuse("run", "invalid settings", exc)
    if args.print_config:
        print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    try:
        model = Path(config.model.check_available())  # a missing model, a hub id out of reach
        if is_published(model):  # a checkpoint edited after it was published
            verified(model)
        check_problem_files(config)  # and a malformed problems file
    except (ValueError, OSError) as exc:
        return refuse("run", "invalid settings", exc)
    refused = _check_services(config)
    if refused:
        return refused
    with contextlib.ExitStack() as held:
        try:  # from before Prefect starts to the end, for the flow's run
            held.enter_context(run_folder_lock(Path(config.run_dir), for_inner_runs=True))
        except RunFolderLocked as exc:
            return refuse("run", "the run folder is in use", exc)
        return _run_flow(config, args)


def _run_flow(config: PostTrainConfig, args: argparse.Namespace) -> int:
    from .post_train import post_train  # Prefect, and the ML stack the flow runs
    from .terminal import terminal

    try:
        start_ephemeral_server()  # stopped with this process, even a SIGKILLed one
    except EphemeralServerError as exc:
        return refuse("run", "Prefect's server", exc)
    verbosity: Verbosity = "quiet" if args.quiet else "verbose" if args.verbose else "normal"
    kept = f"Finished stages are kept in {config.run_dir}: the same command resumes after the last one."

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with terminal(Path(config.run_dir), verbosity):
            state = post_train(config, return_state=True)
    except Stopped as stop:  # Prefect has recorded the flow run as crashed and logged it
        stderr_console().print(f"[red]codepost run: stopped by {stop.signal.name}[/red]\n{kept}")
        return 128 + stop.signal
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not state.is_completed():  # Prefect has logged the traceback
        stderr_console().print(f"[red]codepost run: {state.message}[/red]\n{kept}")
        return 1
    _print_results(config, state.result())
    return 0


class Stopped(BaseException):
    """A SIGTERM (a service manager, a scheduler's time limit), raised where the run was:
    a BaseException, so that Prefect records a crash and lets it through, as it does its own."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


def _check_services(config: PostTrainConfig) -> int:
    """The exit status refusing the run, naming the first service it lacks; 0: none."""
    try:
        for tracker in config.report_to:
            TRACKERS[tracker].check()
    except TrackerUnavailable as exc:
        return refuse("run", "a tracker is unavailable", exc)
    try:
        for engine in settings_of(config, EngineConfig):
            if engine.server_url is not None:
                check_server(engine.server_url)
    except (ConnectionError, RuntimeError) as exc:
        return refuse("run", "a sample server is unavailable", exc)
    try:
        for sandbox in settings_of(config, SandboxSettings):  # every engine the run scores on
            check_sandbox(sandbox)
    except SandboxUnavailable as exc:
        return refuse("run", "the sandbox is unavailable", exc, EXIT_SANDBOX_UNAVAILABLE)
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
