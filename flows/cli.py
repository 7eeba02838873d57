"""The `codepost` command.

It stays fast as it grows: `codepost --help` imports no subcommand, and a subcommand imports
only its own module (`codepost verify` loads neither torch, vllm nor prefect). Each
``module:function`` named in :data:`COMMANDS` adds its parser to the subparsers and sets
``func``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from ..settings.command_line import SettingsParser

# name -> ("module:register function", one-line help shown by `codepost --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": (
        "codepost.verifiers.verify_command:register",
        "run candidate code against problem tests in the sandbox",
    ),
    "verify-server": (
        "codepost.verifiers.server.command:register",
        "serve the sandbox over HTTP: SandboxFusion's /run_code, codepost's /verify",
    ),
    "env-server": (
        "codepost.verifiers.env_server:register",
        "serve the environments (multi-turn episodes) over HTTP and WebSocket, OpenEnv's shape",
    ),
    "gym-server": (
        "codepost.verifiers.gym_server:register",
        "serve codepost's verdicts as NeMo-Gym's code resource server (/seed_session, /verify)",
    ),
    "sample-server": (
        "codepost.pipeline.inference.server:register",
        "serve a sampling engine over HTTP, for stages whose engine.server_url names it",
    ),
    "evaluate": (
        "codepost.pipeline.evaluate_command:register",
        "pass@k of a checkpoint (greedy pass@1, sampled pass@k) in the sandbox",
    ),
    "run": (
        "codepost.flows.commands:register_run",
        "run the whole pipeline (SFT, RL, DPO, evaluation after each) as a Prefect flow",
    ),
    "serve": (
        "codepost.flows.commands:register_serve",
        "serve the deployments (nightly series, every flow on demand) to a Prefect server",
    ),
    "checkpoints": (
        "codepost.pipeline.checkpoints.command:register",
        "list, show, verify, tag and prune the checkpoints of a run folder",
    ),
    "env": (
        "codepost.pipeline.environment:register",
        "versions, devices and the Docker engine, for a bug report",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``command`` fully registered and every other command as a stub."""
    parser = argparse.ArgumentParser(
        prog="codepost", description="Code post-training with a sandboxed verifier."
    )
    parser.add_argument("--version", action="version", version=f"codepost {__version__}")
    subcommands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=SettingsParser
    )
    for name, (target, help_text) in COMMANDS.items():
        if name == command:
            module, _, function = target.partition(":")
            getattr(importlib.import_module(module), function)(subcommands)
        else:
            subcommands.add_parser(name, help=help_text)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command word: the first argument that is not an option (the top level's options
    take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_in(argv)).parse_args(argv)
    return int(args.func(args) or 0)


def entry() -> int:
    """The ``codepost`` program: ``main``, then an exit that skips the interpreter's last
    collection, a walk over every object the command imported (70 ms of `codepost verify
    --server`'s 0.33 s of start and exit), unless triton is loaded (with torch): its bindings
    report each object left to the exit as a leak, 27 lines that read like a crash."""
    code = main()
    if "triton" not in sys.modules:
        gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(entry())
