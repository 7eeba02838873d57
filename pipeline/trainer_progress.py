"""A TRL trainer's optimizer steps as a progress task: its own module, since it subclasses
transformers' callback and the stages' configs load without transformers."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from .progress import Task


class StepProgress(TrainerCallback):
    """A trainer's optimizer steps as a progress task (``sft: training steps``)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.task: Task | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.task = Task(self.description, state.max_steps, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.task is not None:
            self.task.update(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.task is not None:
            self.task.end()
            self.task = None
