"""Weights & Biases: the run and one run per stage in one group (the run folder's name and the
run's id), in the project ``WANDB_PROJECT`` (default ``codepost``), files under
``<run>/tracking/wandb/`` (``WANDB_DIR`` wins). ``WANDB_MODE=offline`` keeps everything on disk
(``wandb sync`` uploads it later)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Tracker, register


def _init(**settings: Any) -> Any:
    import wandb

    # create_new: the pipeline run and a stage's run are both open when they share a process
    return wandb.init(reinit="create_new", settings=wandb.Settings(silent=True), **settings)


@register
class WandB(Tracker):
    name = "wandb"

    def __init__(self, run: Any) -> None:
        self.run = run

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        folder = Path(os.environ.get("WANDB_DIR") or folder / "wandb").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        project = os.environ.get("WANDB_PROJECT", "codepost")
        run_id = uuid.uuid4().hex[:8]
        group = f"{name}-{run_id}"  # this run's stages, not an earlier run's of the same folder
        run = _init(
            project=project, id=run_id, name=name, group=group, job_type="run", dir=str(folder),
            config=dict(params),
        )  # fmt: skip
        return cls(run), {"project": project, "group": group, "dir": str(folder)}

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        from wandb.sdk.wandb_init import _set_global_run

        run = _init(
            project=attach["project"], group=attach["group"], job_type=stage, name=stage,
            dir=attach["dir"],
        )  # fmt: skip
        _set_global_run(run)  # `wandb.run`: TRL's callback logs into it
        return cls(run)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
