"""MLflow: the run in the store that ``MLFLOW_TRACKING_URI`` names (default: a SQLite store,
``<run>/tracking/mlflow.db``), in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default
``codepost``); each stage a child run (``mlflow.parentRunId``). Works with ``mlflow-skinny``.

A tracking server is checked before the run starts (:func:`~.base.check_answers`), and the
client gives up on one that stops answering after seconds, not MLflow's 15 minutes of retries
(:data:`HTTP_DEFAULTS`, which the environment overrides)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Tracker, check_answers, register

BATCH = 100  # MLflow takes at most 100 parameters or 1000 metrics per call
# MLflow's client retries a request 7 times, 2 s doubling each time, each waiting up to 120 s.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@register
class MLflow(Tracker):
    name = "mlflow"

    def __init__(self, uri: str, run_id: str) -> None:
        from mlflow import MlflowClient

        self.uri, self.client, self.run_id = uri, MlflowClient(uri), run_id

    @classmethod
    def check(cls) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith(("http://", "https://")):
            check_answers(f"{uri.rstrip('/')}/health", f"MLFLOW_TRACKING_URI={uri}")

    @property
    def where(self) -> str:
        return f"MLflow store {self.uri}"

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        for variable, value in HTTP_DEFAULTS.items():  # before MLflow reads them, stages too
            os.environ.setdefault(variable, value)
        from mlflow import MlflowClient
        from mlflow.entities import Param

        folder.mkdir(parents=True, exist_ok=True)
        uri = (
            os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        )
        client = MlflowClient(uri)
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "codepost")
        experiment = client.get_experiment_by_name(experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(
                experiment_name,
                # beside the store when it is ours, else the store's default
                artifact_location=None
                if "MLFLOW_TRACKING_URI" in os.environ
                else (folder / "mlflow-artifacts").resolve().as_uri(),
            )
        )
        run_id = client.create_run(experiment_id, run_name=name).info.run_id
        items = [Param(key, value[:6000]) for key, value in params.items()]
        for start in range(0, len(items), BATCH):
            client.log_batch(run_id, params=items[start : start + BATCH])
        return cls(uri, run_id), {
            "uri": uri,
            "experiment_id": experiment_id,
            "run_id": run_id,
        }

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        from mlflow import MlflowClient

        run = MlflowClient(attach["uri"]).create_run(
            attach["experiment_id"], run_name=stage, tags={"mlflow.parentRunId": attach["run_id"]}
        )
        return cls(attach["uri"], run.info.run_id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(name, value, now, step) for name, value in metrics.items()]
        for start in range(0, len(items), 10 * BATCH):
            self.client.log_batch(self.run_id, metrics=items[start : start + 10 * BATCH])

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def finish(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
