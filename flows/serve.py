"""Deployments: ``nightly/<series>`` on a cron schedule, one per series, every flow on demand.

``codepost serve`` registers them with the Prefect server in ``PREFECT_API_URL`` and serves
them: runs triggered from the UI (with the parameter form) or the API, and the scheduled ones,
each execute in a process it starts (``python -m prefect.engine``), in the folder it was started
in. Parameters are checked against the flows' JSON schemas when a run is created
(``enforce_parameter_schema``), and what a schema cannot say when the run starts. Each start
registers the deployments again: schedules, and a pause, set in the UI last until then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from prefect import serve
from prefect.client.orchestration import get_client
from prefect.deployments.runner import EntrypointType
from prefect.schedules import Cron

from ..pipeline.nightly import NightlyConfig
from .nightly import nightly
from .post_train import ACCELERATOR, STAGE_FLOWS

NIGHTLY = "0 2 * * *"
# Runs load their flow by module (`codepost.flows.post_train.sft_flow`), not by file: the
# package's imports are relative, and the stage flows are made from the registry.
MODULE = EntrypointType.MODULE_PATH


def deployments(
    cron: str = NIGHTLY, timezone: str = "UTC", series: Sequence[NightlyConfig] = ()
) -> list[Any]:
    """``nightly/<series>`` on ``cron`` for each of ``series`` (none given: ``nightly/nightly``
    with the default config), ``<flow>/on-demand`` for every flow."""
    built = [
        nightly.to_deployment(
            name=config.series,
            entrypoint_type=MODULE,
            schedules=[Cron(cron, timezone=timezone)],
            # what the series' file sets, no more: a field not set there is derived where
            # the run derives it (each stage's seed, the run's model), not pinned to its default
            parameters={"config": config.model_dump(mode="json", exclude_unset=True)},
            description=f"A night of the series {config.series!r} ({cron} {timezone}): train "
            "from the champion, promote only on a significant gain.",
            tags=["codepost", "nightly"],
        )
        for config in series or [NightlyConfig()]
    ]
    built += [
        flow.to_deployment(
            name="on-demand",
            tags=["codepost"],
            description=flow.description,
            entrypoint_type=MODULE,
        )
        for flow in STAGE_FLOWS
    ]
    return built


async def ensure_accelerator_limit(slots: int = 1) -> None:
    """A tag concurrency limit: at most ``slots`` accelerator-bound task runs at once."""
    async with get_client() as client:
        await client.create_concurrency_limit(tag=ACCELERATOR, concurrency_limit=slots)


def serve_forever(
    cron: str = NIGHTLY,
    timezone: str = "UTC",
    accelerator_slots: int = 1,
    series: Sequence[NightlyConfig] = (),
) -> None:
    asyncio.run(ensure_accelerator_limit(accelerator_slots))
    # Schedules stay active when this process stops: a restart serves them again.
    serve(*deployments(cron, timezone, series), pause_on_shutdown=False)
