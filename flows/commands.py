"""``codepost run``: the whole post-training pipeline as a Prefect flow, with no server to start
(Prefect's ephemeral mode), from the embedded default or a YAML config. ``codepost serve``:
the deployments (a nightly series, every flow on demand) served against a server.

Prefect and TRL read their settings from the environment when they load, so each command sets
it before it imports them. The run's config classes load neither (nor torch): its flags are read
and refused in a second, and Prefect and the ML stack load once the settings are good.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from ..settings.command_line import EXIT_BAD_INPUT, refuse, settings_command
from .ephemeral import allow_a_slow_first_start


def register_run(subparsers: Any) -> argparse.ArgumentParser:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    allow_a_slow_first_start()
    _route_logs()
    from ..pipeline.post_train import PostTrainConfig
    from .run import run

    parser = settings_command(
        subparsers,
        "run",
        PostTrainConfig,
        example="--stages.rl.update.learning-rate 5e-6 --launch.num-processes 2",
        help="run the whole pipeline (SFT, RL, DPO, evaluation after each) as a Prefect flow",
        description="Run the post-train flow with no server to start. Without --config: the "
        "embedded default (SmolLM2-135M on the CPU, MBPP training problems, HumanEval "
        "evaluation, small settings). A run folder that exists resumes: every finished stage "
        "whose config, inputs and code are unchanged is reused.",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--quiet", action="store_true", help="show warnings, errors and the result only"
    )
    shown.add_argument("--verbose", action="store_true", help="show every library's INFO lines too")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (every setting, the defaults too) as YAML and exit",
    )
    parser.set_defaults(func=run)
    return parser


def _route_logs() -> None:
    """Before prefect and trl load: codepost's loggers reach the flow run's logs, and vLLM keeps
    its INFO lines (engine settings, KV cache size) for the run's log files, which importing TRL
    turns to ERROR in this process and in the stage workers it starts (the terminal shows them
    with --verbose only: flows/terminal.py). Settings the user made win."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "codepost")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")


def register_serve(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="serve the deployments (nightly series, every flow on demand) to a Prefect server",
        description="Register and serve the deployments against the Prefect server in "
        "PREFECT_API_URL (start one with `prefect server start`). Runs triggered from the UI "
        "or the API, and the nightly schedule's, execute on this machine, each in a process "
        "this command starts, in the folder it was started in: relative paths in parameters "
        "(runs/..., a series' root) resolve there. Each start registers the deployments "
        "again: a schedule edited in the UI lasts until the next start.",
    )
    parser.add_argument(
        "--cron", default="0 2 * * *", help="the nightly series' schedule (cron, in --timezone)"
    )
    parser.add_argument("--timezone", default="UTC", help="the schedule's time zone (IANA name)")
    parser.add_argument(
        "--accelerator-slots", type=int, default=1, help="accelerator-bound tasks at once"
    )
    parser.add_argument(
        "--series",
        type=Path,
        action="append",
        default=[],
        metavar="YAML",
        help="a nightly series' config (docs/nightly.md), repeated for several series: one "
        "`nightly/<series>` deployment each; none: `nightly/nightly` with the defaults",
    )
    parser.set_defaults(func=serve)
    return parser


def serve(args: argparse.Namespace) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        Console(stderr=True).print(
            "[red]codepost serve[/red]: PREFECT_API_URL is not set; start a server "
            "(`prefect server start --host 127.0.0.1`) and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
        return EXIT_BAD_INPUT
    _route_logs()
    from pydantic import ValidationError

    from ..pipeline.data.problem_sets import check_problem_files
    from ..pipeline.nightly import NightlyConfig
    from ..settings.config import SettingsError, load_config
    from .serve import serve_forever  # after the environment: it loads Prefect

    series = []
    for path in args.series:
        try:  # what a scheduled night would refuse at its start, refused now
            config = load_config(NightlyConfig, path, [])
            check_problem_files(config)
        except (ValidationError, SettingsError, ValueError, OSError) as exc:
            return refuse("serve", f"invalid series {path}", exc)  # a line, however long
        series.append(config)
    names = [config.series for config in series]
    if len(set(names)) < len(names):
        Console(stderr=True).print(f"[red]codepost serve[/red]: a series named twice: {names}")
        return EXIT_BAD_INPUT
    serve_forever(args.cron, args.timezone, args.accelerator_slots, series)
    return 0
