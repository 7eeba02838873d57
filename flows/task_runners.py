"""Where fanned-out tasks run: Prefect's thread pool by default, a Dask cluster (prefect-dask)
or a Ray cluster (prefect-ray). On Dask and Ray each worker process holds its own warm sandbox
pool (the process-wide pool, kept between the tasks the process runs); the same setting points
at a running scheduler or cluster to score on several machines."""

from __future__ import annotations

from typing import Any, Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator


class FanOut(BaseModel):
    """How scoring fans out: the rollouts cut into shards, each a task on the task runner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_runner: Literal["threads", "dask", "ray"] = Field(
        "threads",
        description="threads in this process, a Dask cluster (prefect-dask) or a Ray cluster "
        "(prefect-ray, the `ray` extra)",
    )
    workers: int = Field(
        2, ge=1, le=256, description="threads, or the worker processes of a local cluster"
    )
    shards: int = Field(4, ge=1, le=4096, description="slices of the rollouts, one task each")
    dask_address: str | None = Field(
        None, description="a running Dask scheduler (tcp://host:8786); None = a local cluster"
    )
    ray_address: str | None = Field(
        None, description="a running Ray cluster (ray://head:10001, or auto); None = a local one"
    )

    @model_validator(mode="after")
    def _address_of_the_runner(self) -> FanOut:
        for runner, address in (("dask", self.dask_address), ("ray", self.ray_address)):
            if address is not None and self.task_runner != runner:
                raise ValueError(
                    f"{runner}_address={address!r} is for task_runner={runner!r}, "
                    f"not {self.task_runner!r}"
                )
        return self

    def build(self) -> TaskRunner[Any]:
        if self.task_runner == "threads":
            return ThreadPoolTaskRunner(max_workers=self.workers)
        if self.task_runner == "ray":
            from .ray_runner import ray_task_runner  # loads ray: only for this runner

            return ray_task_runner(self.ray_address, self.workers)
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
