"""Where fanned-out tasks run: Prefect's thread pool by default, or a local Dask cluster
(prefect-dask), whose worker processes each hold their own warm sandbox pool. The same setting
points at a remote Dask scheduler to score on several machines."""

from __future__ import annotations

from typing import Any, Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field


class FanOut(BaseModel):
    """How scoring fans out: the rollouts cut into shards, each a task on the task runner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_runner: Literal["threads", "dask"] = Field(
        "threads", description="threads in this process, or a Dask cluster (prefect-dask)"
    )
    workers: int = Field(2, ge=1, le=256, description="threads, or local Dask worker processes")
    shards: int = Field(4, ge=1, le=4096, description="slices of the rollouts, one task each")
    dask_address: str | None = Field(
        None, description="a running Dask scheduler (tcp://host:8786); None = a local cluster"
    )

    def build(self) -> TaskRunner[Any]:
        if self.task_runner == "threads":
            return ThreadPoolTaskRunner(max_workers=self.workers)
        from prefect_dask import DaskTaskRunner  # loads dask: only for this runner

        if self.dask_address:
            return DaskTaskRunner(address=self.dask_address)
        return DaskTaskRunner(
            cluster_kwargs={
                "n_workers": self.workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": None,
            }
        )
