"""What a tracker is, the registry every tracker module adds itself to, and the check of a
tracker's service before a run starts."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...settings.registry import Registry
from ..endpoints import ask

CHECK_TIMEOUT_S = 5.0  # a service that has not answered by then is not going to take a run


class TrackerUnavailable(RuntimeError):
    """A tracker's service that cannot take a run: the message names its setting (the
    environment variable) and what failed."""


class TrackerFailed(RuntimeError):
    """A tracker that stopped taking a run's records mid-run: the message names where it
    writes."""


class Tracker(ABC):
    """One backend's run: the pipeline run's own, or a stage's, nested in it.

    A tracker module imports its library inside these methods only, so nothing is imported
    unless a run asks for that tracker."""

    name: ClassVar[str]

    @classmethod
    def check(cls) -> None:
        """Raise :class:`TrackerUnavailable` when the service a run would write to does not
        answer or would refuse it (in seconds, before the run starts); local files: nothing."""
        return None

    @property
    def where(self) -> str:
        """Where the run's records go (a folder, a store's URI), for a message."""
        return "?"

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
        """``stage``'s run, nested in the run ``attach`` names."""

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    @abstractmethod
    def log_artifacts(self, paths: list[Path]) -> None:
        """Files of the run (the report, plots); only the run side logs them."""

    @abstractmethod
    def finish(self, failed: bool = False) -> None:
        """End the run, marked failed where the tracker has such a mark."""


TRACKERS: Registry[type[Tracker]] = Registry("tracker")


def register(tracker: type[Tracker]) -> type[Tracker]:
    return TRACKERS.register(tracker.name, tracker)


def check_answers(url: str, variable: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise :class:`TrackerUnavailable` naming ``variable`` unless ``url`` answers HTTP within
    ``timeout_s``: any answer but a server error will do (a login page is a server there).
    A tracker's own client would retry for minutes before its first failure."""
    answer = ask(url, timeout_s)
    if answer.status is None or answer.status >= 500:
        raise TrackerUnavailable(f"{variable}: {url}: {answer.reason}")


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (a NaN is a quantity not measured, not a point)."""
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }
