"""What a tracker is, and the registry every tracker module adds itself to."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar


class Tracker(ABC):
    """One backend's run: the pipeline run's own, or a stage's, nested in it.

    A tracker module imports its library inside these methods only, so nothing is imported
    unless a run asks for that tracker."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        """The pipeline run's tracker run (``folder``: the run folder's ``tracking/``), with
        ``params`` logged, and what a stage's process needs to nest its run in it (JSON)."""

    @classmethod
    @abstractmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        """``stage``'s run, nested in the run ``attach`` names. TRL's own callback for this
        tracker, made after it in this process, logs into it."""

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    @abstractmethod
    def log_artifacts(self, paths: list[Path]) -> None:
        """Files of the run (the report, plots); only the run side logs them."""

    def trainer_arguments(self) -> dict[str, Any]:
        """``TrainingArguments`` that point TRL's callback for this tracker at this run."""
        return {}

    @abstractmethod
    def finish(self, failed: bool = False) -> None:
        """End the run, marked failed where the tracker has such a mark."""


TRACKERS: dict[str, type[Tracker]] = {}


def register(tracker: type[Tracker]) -> type[Tracker]:
    if tracker.name in TRACKERS and TRACKERS[tracker.name] is not tracker:
        raise ValueError(f"tracker {tracker.name!r} is already registered")
    TRACKERS[tracker.name] = tracker
    return tracker


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (a NaN is a quantity not measured, not a point)."""
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }
