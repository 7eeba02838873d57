"""trackio: local runs in the project ``TRACKIO_PROJECT`` (default ``codepost``), the run and
one run per stage in one group; stored under ``TRACKIO_DIR`` (default here:
``<run>/tracking/trackio``). trackio reads ``TRACKIO_DIR`` once, when it is first imported, so
the run side passes the store it really writes to on to the stages. ``trackio show`` opens the
dashboard."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Tracker, register


def _init(**settings: Any) -> Any:
    import trackio

    with contextlib.redirect_stdout(io.StringIO()):  # its banner and dashboard hints
        return trackio.init(embed=False, **settings)


@register
class Trackio(Tracker):
    name = "trackio"

    def __init__(self, project: str, run_name: str, group: str, run: Any = None) -> None:
        self.project, self.run_name, self.group, self.run = project, run_name, group, run

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        os.environ.setdefault("TRACKIO_DIR", str((folder / "trackio").resolve()))
        from trackio import utils

        project = os.environ.get("TRACKIO_PROJECT", "codepost")
        run = _init(project=project, name=name, group=name, config=dict(params))
        group = run.name  # trackio makes a taken name unique
        attach = {"project": project, "group": group, "dir": str(utils.TRACKIO_DIR)}
        return cls(project, group, group, run), attach

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        # Before trackio's first import in the stage's process; its run starts on the first
        # log (a resumed stage's run goes on).
        os.environ["TRACKIO_DIR"] = attach["dir"]
        return cls(attach["project"], f"{attach['group']}/{stage}", attach["group"])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None:
            self.run = _init(
                project=self.project, name=self.run_name, group=self.group, resume="allow"
            )
        self.run.log(dict(metrics), step=step)

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.run.log_artifact(path, name=path.name.replace(".", "-"), type="report")

    def finish(self, failed: bool = False) -> None:
        if self.run is not None:
            with contextlib.redirect_stdout(io.StringIO()):
                self.run.finish()
