"""Retention: a series keeps its champion, every tagged checkpoint and the checkpoints of its
last N nights; the rest go through the registry (:func:`..checkpoints.registry.delete`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..checkpoints.registry import Entry, delete, list_checkpoints


def prunable(entries: Sequence[Entry], nights: Sequence[str], keep_nights: int) -> list[Entry]:
    """The entries to delete: those of the nights before the last ``keep_nights`` of
    ``nights`` (oldest first), never a tagged one (the champion is tagged). A checkpoint that
    belongs to no night of the list is left alone: the series did not make it."""
    if keep_nights < 1:
        raise ValueError(f"keep_nights must be >= 1 (the night that just ran), got {keep_nights}")
    old = set(nights[: max(len(nights) - keep_nights, 0)])
    return [entry for entry in entries if Path(entry.folder).parts[0] in old and not entry.tags]


def prune_nights(series_dir: Path, nights: Sequence[str], keep_nights: int) -> list[Entry]:
    """Delete :func:`prunable`'s checkpoints of the series in ``series_dir``; returns them."""
    doomed = prunable(list_checkpoints(series_dir), nights, keep_nights)
    for entry in doomed:
        delete(entry.path)
    return doomed
