"""TensorBoard: event files under ``<run>/tracking/tensorboard/``: ``run/`` (the config, each
evaluation, the report and plots) and one folder per stage, which TensorBoard lists as runs.
TRL's callback writes its events into the stage's folder too."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Tracker, register


@register
class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        root = folder / "tensorboard"
        run = cls(root / "run")
        table = "\n".join(f"| {key} | {value} |" for key, value in params.items())
        run.writer.add_text("config", f"| parameter | value |\n| --- | --- |\n{table}")
        return run, {"folder": str(root.resolve())}

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        folder = Path(attach["folder"]) / stage
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(folder)  # where TRL's callback writes
        return cls(folder)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_artifacts(self, paths: list[Path]) -> None:
        from matplotlib.image import imread

        for path in paths:
            if path.suffix == ".png":
                self.writer.add_image(str(path.name), imread(path)[..., :3], dataformats="HWC")
            else:
                self.writer.add_text(path.name, path.read_text())

    def finish(self, failed: bool = False) -> None:
        self.writer.close()
