"""``codepost checkpoints``: the catalog of a run folder (list, show, verify, tag, prune), and
a version pushed to the Hugging Face hub."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ...settings.command_line import EXIT_BAD_INPUT, stdout_console
from ..atomic import WriteError
from ..rl.metric_names import Reward
from . import catalog
from .hub import HubError, push_to_hub
from .manifest import verify


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "checkpoints",
        help="list, show, verify, tag, prune and push the checkpoints of a run folder",
        description="The checkpoint catalog of a run folder: every published checkpoint "
        "(model folder + manifest.json) under it is a version.",
    )
    parser.add_argument("--root", type=Path, default=Path("runs"), help="the run folder")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every version, oldest first, with stage, tags, metrics")
    actions.add_parser("show", help="a version's manifest").add_argument(
        "ref", help="tag, folder or stage/version"
    )
    actions.add_parser("verify", help="check file hashes against the manifest").add_argument(
        "ref", nargs="?", help="tag, folder or stage/version (default: every version)"
    )
    tag = actions.add_parser("tag", help="point a tag (best, production, ...) at a version")
    tag.add_argument("ref")
    tag.add_argument("name")
    prune = actions.add_parser("prune", help="delete all but the newest K and the tagged ones")
    prune.add_argument("--keep-last", type=int, required=True)
    prune.add_argument("--dry-run", action="store_true")
    push = actions.add_parser(
        "push",
        help="upload a version to a Hugging Face hub model repo, with its card (not its "
        "trainer state)",
    )
    push.add_argument("ref", help="tag, folder or stage/version")
    push.add_argument("repo_id", help="the model repo (owner/name), made if it does not exist")
    push.add_argument("--private", action="store_true", help="make the repo private")
    parser.set_defaults(func=checkpoints)
    return parser


def checkpoints(args: argparse.Namespace) -> int:
    console, err = stdout_console(), Console(stderr=True)
    try:
        if args.action == "list":
            table = Table(title=f"checkpoints under {args.root}")
            table.add_column("version", no_wrap=True)  # what `tag` and `verify` take
            for column in ("state", "tags", "parent", "created", "key metrics"):
                table.add_column(column)
            for entry in catalog.list_checkpoints(args.root, unpublished=True):
                manifest = entry.manifest
                table.add_row(
                    entry.name,
                    entry.state if entry.healthy else f"[red]{entry.state}[/red]",
                    ", ".join(entry.tags),
                    Path(manifest.parent or "").name if manifest else "",
                    manifest.created_at if manifest else "",
                    _key_metrics(manifest.metrics) if manifest else "",
                )
            console.print(table)
        elif args.action == "show":
            entry = catalog.resolve(args.root, args.ref)
            if entry.manifest is None:
                raise ValueError(f"{entry.name} is {entry.state}")
            console.print_json(entry.manifest.model_dump_json())
        elif args.action == "verify":
            entries = (
                [catalog.resolve(args.root, args.ref)]
                if args.ref
                else catalog.list_checkpoints(args.root)
            )
            failed = 0
            for entry in entries:
                problems = list(entry.problems) if entry.manifest is None else verify(entry.path)
                for problem in problems:
                    err.print(f"[red]{entry.name}[/red]: {problem}")
                failed += bool(problems)
                if not problems and entry.manifest is not None:
                    console.print(f"{entry.name}: {len(entry.manifest.files)} files match")
            if failed:
                return 1
        elif args.action == "tag":
            entry = catalog.tag(args.root, args.ref, args.name)
            console.print(f"{args.name} -> {entry.name} ({entry.path})")
        elif args.action == "prune":
            doomed = catalog.prune(args.root, args.keep_last, dry_run=args.dry_run)
            verb = "would delete" if args.dry_run else "deleted"
            names = [e.name if e.healthy else f"{e.name} ({e.state})" for e in doomed]
            console.print(f"{verb} {len(doomed)}: {', '.join(names) or '-'}")
        elif args.action == "push":
            entry = catalog.resolve(args.root, args.ref)
            url = push_to_hub(entry.path, args.repo_id, private=args.private)
            console.print(f"{entry.name} -> {args.repo_id}: {url}")
    except (LookupError, ValueError, FileNotFoundError) as exc:
        err.print(f"[red]codepost checkpoints[/red]: {exc}")
        return EXIT_BAD_INPUT
    except (WriteError, HubError) as exc:  # a full disk, a hub out of reach: named, no traceback
        err.print(f"[red]codepost checkpoints[/red]: {exc}")
        return 1
    return 0


def _key_metrics(metrics: dict[str, Any]) -> str:
    names = (Reward.MEAN, Reward.PASS_RATE, "train_loss", "pass@1")
    shown = {name: metrics.get(name) for name in names}
    return ", ".join(
        f"{name} {value:.3f}" for name, value in shown.items() if isinstance(value, float)
    )
