"""What every ``codepost`` command of the pipeline shares: its exit codes, the console its
tables go to, and its settings read from a YAML file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

EXIT_BAD_INPUT = 2
EXIT_SANDBOX_UNAVAILABLE = 3
EXIT_SANDBOX_ERRORS = 4


def read_settings(path: Path, config_name: str) -> dict[str, Any]:
    """The mapping of settings in YAML file ``path``; ValueError names the file, and the line
    where it stops being YAML, so a command refuses it as bad input."""
    with path.open() as stream:  # read from the stream, yaml's messages name the file
        try:
            data = yaml.safe_load(stream) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of {config_name} settings")
    return data


def stdout_console() -> Console:
    """Rich's console for tables on stdout: the terminal's width, or room for whole rows when
    the output is piped or logged (rich would fold them into 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=200)
