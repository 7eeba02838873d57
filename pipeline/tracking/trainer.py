"""A TRL trainer's logs to the stage's tracker runs: a module of its own, since it subclasses
transformers' callback and the tracking package loads without transformers."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.integrations.integration_utils import rewrite_logs

from . import log_stage_metrics


class TrackedLogs(TrainerCallback):
    """What a trainer logs (``train/loss``, ``train/learning_rate``, DPO's ``eval/...``: the
    names TRL's own callbacks give them) at the run's step: the trainer's global step after
    the step the stage started at. It stands in for TRL's ``report_to``, whose callbacks log at
    the trainer's step alone, and which would fail the stage with its tracker."""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if logs:
            log_stage_metrics(rewrite_logs(logs), state.global_step)
