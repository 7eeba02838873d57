"""The checkpoint catalog of a run folder: list, show, tag (``best``, ``production``), prune.

Every published checkpoint under the folder (a model folder with ``manifest.json``) is a
version; tags live in ``tags.json`` at the folder's root, written atomically. A version whose
manifest cannot be read or names a file that is gone is *broken*: it is listed as such, never
tagged, and never counted among the versions pruning keeps (so a broken newest version cannot
cost a healthy older one). A model folder without a manifest is listed as unpublished and left
alone: it may be a publish that never finished, or a folder that is not ours.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..atomic import write_json
from .manifest import MANIFEST, CheckpointManifest, read_manifest

TAGS_FILE = "tags.json"
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class Entry:
    path: Path
    folder: str  # relative to the catalog's root
    manifest: CheckpointManifest | None  # None: unreadable, or none at all (unpublished)
    tags: tuple[str, ...]
    problems: tuple[str, ...]  # why it cannot be used; empty when it looks whole
    published: bool = True  # it has a manifest (readable or not)

    @property
    def name(self) -> str:
        if self.manifest is None:
            return self.folder
        return f"{self.manifest.stage}/{self.manifest.version}"

    @property
    def healthy(self) -> bool:
        return self.manifest is not None and not self.problems

    @property
    def state(self) -> str:
        if not self.published:
            return f"unpublished (no {MANIFEST})"
        return "ok" if self.healthy else "broken: " + "; ".join(self.problems)


def _entry(root: Path, folder: Path, tags: dict[str, str]) -> Entry:
    """The folder as a registry entry; a cheap check (files present, manifest readable):
    ``manifest.verify`` compares the hashes."""
    relative = str(folder.relative_to(root))
    names = tuple(sorted(tag for tag, target in tags.items() if target == relative))
    if not (folder / MANIFEST).is_file():
        return Entry(folder, relative, None, names, (f"no {MANIFEST}",), published=False)
    try:
        manifest = read_manifest(folder)
    except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        return Entry(folder, relative, None, names, (f"{MANIFEST} unreadable ({exc})",))
    missing = tuple(f"{name} missing" for name in manifest.files if not (folder / name).is_file())
    return Entry(folder, relative, manifest, names, missing)


def read_tags(root: Path) -> dict[str, str]:
    """The root's tags; ValueError naming the file when it is not a mapping of names."""
    path = Path(root) / TAGS_FILE
    if not path.is_file():
        return {}
    try:
        tags = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(tags, dict) or not all(type(v) is str for v in tags.values()):
        raise ValueError(f"{path}: not a mapping of tag names to checkpoint folders")
    return tags


def list_checkpoints(root: Path, *, unpublished: bool = False) -> list[Entry]:
    """Every checkpoint under ``root`` (broken ones too), oldest first; with ``unpublished``,
    also the model folders without a manifest, last. A ``root`` that is not a folder is a
    mistyped path, not an empty registry: FileNotFoundError names it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    tags = read_tags(root)
    folders = {path.parent for path in root.rglob(MANIFEST)}
    if unpublished:
        folders |= {path.parent for name in WEIGHTS_FILES for path in root.rglob(name)}
        folders |= {path.parent for path in root.rglob("config.json") if _is_model_config(path)}
    entries = [
        _entry(root, folder, tags)
        for folder in folders
        if not any(part.startswith(".") for part in folder.relative_to(root).parts)
    ]  # a dot folder is a staging folder
    return sorted(
        entries,
        key=lambda e: (
            e.manifest is None,
            e.manifest.created_at if e.manifest else "",
            str(e.path),
        ),
    )


def _is_model_config(path: Path) -> bool:
    """Whether ``path`` is a model's ``config.json`` (``model_type``), not another config by
    that name (an RL stage's own, beside its checkpoints)."""
    try:
        return "model_type" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def resolve(root: Path, ref: str) -> Entry:
    """A checkpoint by tag, folder (relative to ``root``) or ``stage/version``."""
    entries = list_checkpoints(root)
    target = read_tags(root).get(ref, ref)
    for entry in entries:
        if target in (entry.folder, entry.name, str(entry.path)):
            return entry
    known = ", ".join(e.name for e in entries) or "none"
    raise LookupError(f"no checkpoint {ref!r} under {root} (checkpoints: {known})")


def tag(root: Path, ref: str, name: str) -> Entry:
    """Point tag ``name`` at checkpoint ``ref`` (moving it if it pointed elsewhere); a broken
    checkpoint is refused, naming what is wrong with it."""
    if not name or "/" in name:
        raise ValueError(f"a tag is a plain name, got {name!r}")
    entry = resolve(root, ref)
    if not entry.healthy:
        raise ValueError(f"{entry.name} cannot be tagged: it is {entry.state}")
    tags = read_tags(root)
    tags[name] = entry.folder
    write_json(Path(root) / TAGS_FILE, tags)
    return resolve(root, name)


def prune(root: Path, keep_last: int, *, dry_run: bool = False) -> list[Entry]:
    """Delete every checkpoint but the newest ``keep_last`` healthy ones and the tagged ones;
    broken ones (nothing can load them) go first, unless tagged. Returns the deleted (or, with
    ``dry_run``, the deletable) entries."""
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, got {keep_last}")
    entries = list_checkpoints(root)
    healthy = [e for e in entries if e.healthy]
    kept = healthy[len(healthy) - keep_last :] if keep_last else []
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
