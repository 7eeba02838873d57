"""Deployments: ``post-train`` on a nightly cron schedule, every stage flow on demand.

``codepost serve`` registers them with the Prefect server in ``PREFECT_API_URL`` and serves
them from this process: runs triggered from the UI (with the parameter form) or the API, and
the scheduled ones, execute here. Parameters are checked against the flows' pydantic schemas
when a run is created (``enforce_parameter_schema``), and validated again when it starts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import serve
from prefect.client.orchestration import get_client
from prefect.deployments.runner import EntrypointType
from prefect.schedules import Cron

from .post_train import ACCELERATOR, STAGE_FLOWS, post_train

NIGHTLY = "0 2 * * *"
# Runs load their flow by module (`codepost.flows.post_train.sft_flow`), not by file: the
# package's imports are relative, and the stage flows are made from the registry.
MODULE = EntrypointType.MODULE_PATH


def deployments(cron: str = NIGHTLY, timezone: str = "UTC") -> list[Any]:
    """``post-train/nightly`` on ``cron``; ``<stage>/on-demand`` for every flow."""
    built = [
        post_train.to_deployment(
            name="nightly",
            entrypoint_type=MODULE,
            schedules=[Cron(cron, timezone=timezone)],
            description=f"The whole pipeline, every night ({cron} {timezone}), or on demand.",
            tags=["codepost", "nightly"],
        )
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


def serve_forever(cron: str = NIGHTLY, timezone: str = "UTC", accelerator_slots: int = 1) -> None:
    asyncio.run(ensure_accelerator_limit(accelerator_slots))
    # Schedules stay active when this process stops: a restart serves them again.
    serve(*deployments(cron, timezone), pause_on_shutdown=False)
