"""The checkpoint registry of a run folder: list, show, tag (``best``, ``production``), prune.

Every published checkpoint under the folder (a model folder with ``manifest.json``) is a
version; tags live in ``tags.json`` at the folder's root, written atomically. Pruning keeps the
newest K versions and every tagged one, and never touches an unpublished folder.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..atomic import write_json
from .manifest import MANIFEST, CheckpointManifest, read_manifest

TAGS_FILE = "tags.json"


@dataclass(frozen=True)
class Entry:
    path: Path
    manifest: CheckpointManifest
    tags: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.manifest.stage}/{self.manifest.version}"


def read_tags(root: Path) -> dict[str, str]:
    path = Path(root) / TAGS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def list_checkpoints(root: Path) -> list[Entry]:
    """Every published checkpoint under ``root``, oldest first. A ``root`` that is not a
    folder is a mistyped path, not an empty registry: FileNotFoundError names it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    tags = read_tags(root)
    entries = []
    for manifest_path in root.rglob(MANIFEST):
        folder = manifest_path.parent
        if any(part.startswith(".") for part in folder.relative_to(root).parts):
            continue  # a staging folder
        relative = str(folder.relative_to(root))
        names = tuple(sorted(tag for tag, target in tags.items() if target == relative))
        entries.append(Entry(folder, read_manifest(folder), names))
    return sorted(entries, key=lambda e: (e.manifest.created_at, str(e.path)))


def resolve(root: Path, ref: str) -> Entry:
    """A checkpoint by tag, folder (relative to ``root``) or ``stage/version``."""
    entries = list_checkpoints(root)
    target = read_tags(root).get(ref, ref)
    for entry in entries:
        if target in (str(entry.path.relative_to(root)), entry.name, str(entry.path)):
            return entry
    known = ", ".join(e.name for e in entries) or "none"
    raise LookupError(f"no checkpoint {ref!r} under {root} (checkpoints: {known})")


def tag(root: Path, ref: str, name: str) -> Entry:
    """Point tag ``name`` at checkpoint ``ref`` (moving it if it pointed elsewhere)."""
    if not name or "/" in name:
        raise ValueError(f"a tag is a plain name, got {name!r}")
    entry = resolve(root, ref)
    tags = read_tags(root)
    tags[name] = str(entry.path.relative_to(root))
    write_json(Path(root) / TAGS_FILE, tags)
    return resolve(root, name)


def prune(root: Path, keep_last: int, *, dry_run: bool = False) -> list[Entry]:
    """Delete every checkpoint but the newest ``keep_last`` and the tagged ones; returns the
    deleted (or, with ``dry_run``, the deletable) entries."""
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, got {keep_last}")
    entries = list_checkpoints(root)
    kept = entries[len(entries) - keep_last :] if keep_last else []
    doomed = [e for e in entries if e not in kept and not e.tags]
    if not dry_run:
        for entry in doomed:
            delete(entry.path)
    return doomed


def delete(folder: Path) -> None:
    """Delete a checkpoint folder, published or not. The manifest goes first, so a crash
    mid-delete leaves an unpublished folder, never a "checkpoint" with files missing."""
    (Path(folder) / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder)
