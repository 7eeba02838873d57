"""The ``nightly`` flow: one night of a series (:mod:`codepost.pipeline.nightly`), its stages as
tasks, and the gate's decision and the series' history as artifacts, whatever the decision.

A night that finds another night of its series running ends Cancelled, saying so in one line,
without training; a failed night ends Failed, its decision (the champion kept, or a promotion
the next night finishes) published first; a night cancelled from Prefect records its decision
(cancelled, the champion kept) and publishes it before it stops.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled, Cancelling, State

from ..pipeline.nightly import NightFailed, NightlyConfig, NightRecord, run_night
from ..pipeline.nightly.history import REPORT_FILE
from ..pipeline.nightly.records import NIGHT_RECORD
from ..pipeline.run_lock import RunFolderLocked
from .post_train import _key, _validated, _with_plots_inlined, execute_as_task
from .stage_worker import stage_worker

# How long a run of a deployment that asked to be cancelled waits for its runner to stop it
# (a second or two, with `codepost serve`).
CANCEL_WAIT_S = 120


@flow(name="nightly", validate_parameters=False)
def nightly(
    night: str | None = None,
    config: NightlyConfig = NightlyConfig(),  # noqa: B008
) -> dict[str, Any] | State:
    """A night of ``config.series``: train from the champion, promote only on a gain
    significant at the night's share of the series' alpha.

    Args:
        night: the night's folder in the series; default: today's UTC date (a night that has
            run is not run again)
        config: the series: its run, the promotion gate, the retention
    """
    config = _validated(config, NightlyConfig, "config")
    night = night or dt.datetime.now(dt.timezone.utc).date().isoformat()
    try:
        with stage_worker(config.series_dir / night / "logs" / "stage-worker.log"):
            record = run_night(config, night, execute_as_task)
    except RunFolderLocked as exc:
        return _cancelled(f"night {night} of {config.series} did not run: {exc}")
    except NightFailed as exc:
        _publish(config, exc.record)
        raise
    except TerminationSignal:  # cancelled from Prefect: run_night has recorded the decision
        recorded = config.series_dir / night / NIGHT_RECORD
        stopped = NightRecord.read(recorded) if recorded.is_file() else None
        if stopped is not None and stopped.decision is not None:
            _publish(config, stopped)
        raise
    _publish(config, record)
    return record.model_dump(mode="json")


def _cancelled(message: str) -> State:
    """The run Cancelled with ``message``, logged as one line. A run of a deployment asks its
    runner to cancel it, as the UI's Cancel does, and waits to be stopped: a Cancelled state
    returned to the engine that runs a deployment's flow is logged as an unexpected
    exception, with its traceback, and the process exits 1. A run called from Python gets the
    state back."""
    get_run_logger().warning(message)
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None or run.deployment_id is None:
        return Cancelled(message=message)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(message=message), force=True)
    time.sleep(CANCEL_WAIT_S)  # the runner stops this process (SIGTERM) before it wakes
    return Cancelled(message=message)


def _publish(config: NightlyConfig, record: NightRecord) -> None:
    """The decision with its numbers, and the series' report with its plot."""
    decision = record.decision
    assert decision is not None
    verdict = (
        "promoted"
        if decision.promoted
        else "promoting (the next night moves the tag)"
        if decision.promoting
        else "kept the champion"
    )
    lines = [
        f"# {config.series}, night {record.night}: {verdict}",
        "",
        decision.reason,
        "",
        f"- started from: `{record.started_from}`",
        f"- the night's checkpoint: `{decision.candidate}`",
        f"- champion now: `{decision.champion}`",
        f"- alpha: {decision.alpha} over the series",
    ]
    if (spend := decision.spend) is not None:
        lines.append(
            f"- level: {spend.level:.3g}, night {spend.test} tested against this champion "
            f"({spend.spent:.3g} of alpha spent on it)"
        )
    lines += [f"- gate: {decision.gate.summary()}"] if decision.gate else []
    lines += [f"- guard: {guard.summary()}" for guard in decision.guards]
    lines += [f"- read {d.count} problems of `{d.problems['source']}` ({d.fingerprint})"
              for d in record.data]  # fmt: skip
    create_markdown_artifact(
        "\n".join(lines),
        key=_key(f"{config.series}-decision"),
        description=f"{config.series}: the gate's decision on night {record.night}",
    )
    report = config.series_dir / REPORT_FILE
    create_markdown_artifact(
        _with_plots_inlined(Path(report).read_text(), report.parent),
        key=_key(f"{config.series}-history"),
        description=f"{config.series}: every night, pass@1 with its interval, promotions",
    )
