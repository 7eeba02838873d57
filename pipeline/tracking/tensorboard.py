"""TensorBoard: event files under ``<run>/tracking/tensorboard/``: ``run/`` (the config, each
evaluation, the report and plots) and one folder per stage, which TensorBoard lists as runs.

A resumed run writes into the same folders, logging some steps again: a writer purges the
points an earlier attempt left from its first step on (TensorBoard's ``purge_step``), so that a
step has one point. The run side logs the whole run again (reused evaluations too) and purges
from step 0; a stage from the first step it logs (a resumed RL stage: the iteration after the
last one published; a trainer: its first logged step)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Tracker, register

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


@register
class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer: SummaryWriter | None = None

    def _writer(self, step: int) -> SummaryWriter:
        """The writer, opened at the first point (at ``step``), purging an earlier attempt's
        points from there on."""
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=step)
        return self.writer

    @property
    def where(self) -> str:
        return f"TensorBoard folder {self.folder}"

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        root = folder / "tensorboard"
        run = cls(root / "run")
        table = "\n".join(f"| {key} | {value} |" for key, value in params.items())
        run._writer(0).add_text("config", f"| parameter | value |\n| --- | --- |\n{table}")
        return run, {"folder": str(root.resolve())}

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        return cls(Path(attach["folder"]) / stage)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self._writer(step)
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)
        writer.flush()

    def log_artifacts(self, paths: list[Path]) -> None:
        from matplotlib.image import imread

        writer = self._writer(0)
        for path in paths:
            if path.suffix == ".png":
                writer.add_image(str(path.name), imread(path)[..., :3], dataformats="HWC")
            else:
                writer.add_text(path.name, path.read_text())

    def finish(self, failed: bool = False) -> None:
        if self.writer is not None:
            self.writer.close()
