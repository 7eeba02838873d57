"""Scoring's shards on a Ray cluster: prefect-ray's task runner, with two things made explicit.

- A shard whose worker process dies (killed, out of memory, its node lost) runs again from the
  start on another worker, as the same task run: Ray submits again a task whose worker died
  (``max_retries``), and leaves exceptions to Prefect's retries (``retry_exceptions`` off). A
  shard's file is written whole or not at all, so the dead attempt leaves no verdict behind, and
  the owner guard of its sandbox pool removes its containers.
- The workers report to the flow's Prefect API. A flow on Prefect's ephemeral server has no API
  URL in its settings: each Ray worker would start an ephemeral server of its own (6 s each on
  2 cores) and record its task runs there, out of sight.
- Ray leaves the flow's process as it was: by default the driver replaces ``builtins.print``
  with its progress bars' ``safe_print`` (``RAY_TQDM_PATCH_PRINT``), which every later
  ``print`` of the process, and anything that names ``print`` (a pickle), would meet.
"""

from __future__ import annotations

import os
from typing import Any

from prefect.client.orchestration import get_client
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options

LOST_WORKER_RETRIES = 3


class ShardRunner(RayTaskRunner):
    """prefect-ray's runner; a task whose worker process died is submitted again."""

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Any = None,
        dependencies: Any = None,
    ) -> Any:
        with remote_options(max_retries=LOST_WORKER_RETRIES, retry_exceptions=False):
            return super().submit(task, parameters, wait_for, dependencies)


def ray_task_runner(address: str | None, workers: int) -> ShardRunner:
    """A runner on the cluster at ``address``, or on a local one of ``workers`` CPUs (one
    worker process each) started for the flow run and stopped after it."""
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")  # read when the driver's bars start
    api = str(get_client(sync_client=True).api_url)
    init: dict[str, Any] = {"runtime_env": {"env_vars": {"PREFECT_API_URL": api}}}
    if address is None:
        init |= {"num_cpus": workers, "include_dashboard": False}
    return ShardRunner(address=address, init_kwargs=init)
