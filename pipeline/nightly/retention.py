"""Retention: a series keeps its champion, every tagged checkpoint and the checkpoints of its
last N nights (in the order they first started, which a rerun does not change); the rest go
through the catalog (:func:`..checkpoints.catalog.delete`), each with the record of the stage
that made it, so a night asked again makes it again instead of refusing a record whose output
is gone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..checkpoints.catalog import Entry, delete, list_checkpoints
from .records import NightRecord


def prunable(entries: Sequence[Entry], nights: Sequence[str], keep_nights: int) -> list[Entry]:
    """The entries to delete: those of the nights before the last ``keep_nights`` of
    ``nights`` (oldest first), never a tagged one (the champion is tagged). A checkpoint that
    belongs to no night of the list is left alone: the series did not make it."""
    if keep_nights < 1:
        raise ValueError(f"keep_nights must be >= 1 (the night that just ran), got {keep_nights}")
    old = set(nights[: max(len(nights) - keep_nights, 0)])
    return [entry for entry in entries if Path(entry.folder).parts[0] in old and not entry.tags]


def stage_record(checkpoint: Path, night_dir: Path) -> Path | None:
    """The record of the stage that made ``checkpoint``: ``<folder>.json`` beside the stage's
    folder, which is the checkpoint or holds it (RL's iterations); None when there is none."""
    parts = checkpoint.relative_to(night_dir).parts
    for depth in range(len(parts), 0, -1):  # the checkpoint, then the folders holding it
        folder = night_dir.joinpath(*parts[:depth])
        record = folder.with_name(f"{folder.name}.json")
        if record.is_file():
            return record
    return None


def prune_nights(series_dir: Path, history: Sequence[NightRecord], keep_nights: int) -> list[Entry]:
    """Delete :func:`prunable`'s checkpoints of the series in ``series_dir`` (``history``
    oldest first), each after the record of the stage that made it; returns them. A night
    still promoting keeps its checkpoint: it is the next champion."""
    nights = [r.night for r in history if not (r.decision and r.decision.promoting)]
    doomed = prunable(list_checkpoints(series_dir), nights, keep_nights)
    for entry in doomed:
        record = stage_record(entry.path, Path(series_dir) / Path(entry.folder).parts[0])
        if record is not None:  # first: a crash in between leaves a stage to make again
            record.unlink()
        delete(entry.path)
    return doomed
