"""The `codepost` command. Each subcommand imports its package only when it runs."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from verifiers import cli as verify_cli

    parser = argparse.ArgumentParser(
        prog="codepost", description="Code post-training with a sandboxed verifier."
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verify_cli.register(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
