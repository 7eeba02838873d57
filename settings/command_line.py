"""What every ``codepost`` command of the pipeline shares: its exit codes, the console its
tables go to, and its parser, which reads every field of the command's config as a flag
(:mod:`.config`)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

# .config is imported where a command reads its settings: its models and YAML take 25 ms of
# the start of every command, `codepost --help` too, which reads none.

M = TypeVar("M", bound=BaseModel)

EXIT_BAD_INPUT = 2
EXIT_SANDBOX_UNAVAILABLE = 3
EXIT_SANDBOX_ERRORS = 4


def stdout_console() -> Console:
    """Rich's console for tables on stdout: the terminal's width, or room for whole rows when
    the output is piped or logged (rich would fold them into 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def stderr_console() -> Console:
    """Rich's console for messages on stderr: a line stays one line, piped or logged."""
    return Console(stderr=True, soft_wrap=True)


def refuse(command: str, what: str, problem: object, code: int = EXIT_BAD_INPUT) -> int:
    """Say why ``command`` refuses to start, a line for each problem (a message of several
    problems has a line each), and return its exit status."""
    stderr_console().print(f"[red]codepost {command}: {what}[/red]: {escape(str(problem))}")
    return code


class SettingsParser(argparse.ArgumentParser):
    """A command's parser: its own options, plus every field of ``settings_model`` (when set)
    as a dotted flag, collected into ``args.settings`` before argparse reads the rest. Its
    help lists the settings after the options: each section in a line (``--help``), or every
    setting (``--help-all``); both are written only when asked for."""

    settings_model: type[BaseModel] | None = None
    settings_example = ""
    every_setting = False  # --help-all

    def format_help(self) -> str:
        if self.settings_model is not None:
            self.epilog = _settings_epilog(
                self.settings_model, self.settings_example, self.every_setting
            )
        return super().format_help()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.settings_model is None or args is None:
            return super().parse_known_args(args, namespace)
        from .config import split_settings

        flags, rest = split_settings(args, self.settings_model)
        parsed, extras = super().parse_known_args(rest, namespace)
        unknown = [item for item in extras if item.startswith("-")]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._close_to(unknown[0])}")
        parsed.settings = flags
        return parsed, extras

    def _close_to(self, option: str) -> str:
        """Flags spelled like ``option`` (an option of an earlier version, a typo)."""
        assert self.settings_model is not None
        from .config import setting_flags

        known = setting_flags(self.settings_model)
        known += [string for action in self._actions for string in action.option_strings]
        name = option.partition("=")[0].lstrip("-")
        close = [
            flag
            for flag in known
            if difflib.SequenceMatcher(None, name, flag.rpartition(".")[2].lstrip("-")).ratio()
            > 0.8
        ]
        return f" (did you mean {', '.join(close[:3])}?)" if close else ""


def settings_command(
    subparsers: Any, name: str, model: type[BaseModel], *, example: str, **kwargs: Any
) -> argparse.ArgumentParser:
    """A subcommand whose settings are ``model``'s fields, with ``--config`` for a YAML file
    of them; ``--help`` lists its sections, ``--help-all`` every setting."""
    parser = subparsers.add_parser(name, formatter_class=_Formatter, **kwargs)
    if not isinstance(parser, SettingsParser):
        raise TypeError("a settings command needs add_subparsers(parser_class=SettingsParser)")
    parser.settings_model, parser.settings_example = model, example
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help=f"YAML file of {model.__name__} settings"
    )
    parser.add_argument(
        "--help-all", action=_HelpAll, help="show this help with every setting, and exit"
    )
    parser.set_defaults(settings=[])
    return parser


def server_command(
    subparsers: Any,
    name: str,
    model: type[M],
    serve: Callable[[M], int],
    token_env: str,
    *,
    example: str,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """A server's subcommand (:func:`settings_command`): its settings from ``--config`` and its
    flags, its bearer token from the variable ``token_env`` where neither gives one (set, even
    empty, it must be a valid token, as a flag's is); refused in one line when they are wrong,
    else ``serve(config)``."""
    parser = settings_command(subparsers, name, model, example=example, **kwargs)

    def run(args: argparse.Namespace) -> int:
        from .config import load_config

        try:
            config = load_config(model, args.config, args.settings)
            if getattr(config, "token", None) is None and token_env in os.environ:
                config = model.model_validate(
                    {**config.model_dump(), "token": os.environ[token_env]}
                )
        except (ValueError, OSError) as exc:  # SettingsError, ValidationError, unreadable file
            return refuse(name, "invalid settings", exc)
        return serve(config)

    parser.set_defaults(func=run)
    return parser


def _settings_epilog(model: type[BaseModel], example: str, every: bool) -> str:
    from .config import settings_help

    intro = (
        f"settings: every field of {model.__name__} is a flag, by its path (e.g. {example}); a "
        "flag sets that one field over the YAML of --config (or the default) and keeps every "
        "other. Values are YAML (1e-6, true, null, [1, 8]); a bool flag alone is true, "
        "--no-FLAG false. "
    )
    intro += "Every setting, by section:" if every else "A line per section; --help-all lists them:"
    return intro + "\n\n" + settings_help(model, every=every)


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every setting, then exit as ``--help`` does."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        assert isinstance(parser, SettingsParser)
        parser.every_setting = True
        parser.print_help()
        parser.exit()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The settings list as it is written (the epilog), the options as argparse writes them."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        head, _, table = text.partition("\n\n")
        return textwrap.fill(head, width) + ("\n\n" + table if table else "")
