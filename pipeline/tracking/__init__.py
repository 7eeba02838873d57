"""Experiment trackers (``report_to``): one pipeline run is one tracker run, and each stage that
reports metrics is a run nested in it (an MLflow child run, a W&B run of the same group, a
TensorBoard sub-folder, a trackio run of the same group).

One step for the whole run, which never goes back: the **run's step** counts the updates the
run's stages have made to the model, in the order they ran (an optimizer step of SFT and DPO,
an iteration of RL: the policy version its rollouts carry; 0: the base model). A stage logs at
the step the run was at when it started plus its own step, which it logs too (``stage/step``);
an evaluation is logged at the step at which the model it evaluated was made. The stage is the
nested run a point is in.

Two sides, each in the process where its metrics are:

* the **run side** (:class:`RunTracking`, in the run loop's process): the resolved config as
  parameters; each evaluation's pass@k with its 95% interval (:func:`evaluation_metrics`); at
  the end the report and the plots as artifacts. It moves the run's step on by what each stage
  made (its checkpoint's manifest counts the updates: ``steps``);
* the **stage side** (:func:`log_stage_metrics`, in the process that runs the stage: this one,
  the stage worker, or rank 0 of a launch): RL's iteration metrics under their
  ``metrics.jsonl`` names, and the logs of SFT's and DPO's trainers (``train/loss``, ...:
  :class:`.trainer.TrackedLogs` in place of TRL's own ``report_to``, which would log at the
  trainer's step).

The run side tells the stage side what to attach to in three environment variables (the
trackers: :data:`ENV`; the stage running: :data:`STAGE_ENV`; the run's step when it started:
:data:`STEP_ENV`), which a process started for a stage inherits and the stage worker receives
with every call. A tracker is one module of this package that registers itself
(:func:`.base.register`); its library is imported only when a run asks for it.

A tracker that fails mid-run (a full disk, a server gone) is reported, naming where it writes,
and left out from then on, on either side: the run's stages are worth more than its records.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoints.manifest import is_published, read_manifest
from ..resources import on_close
from .base import TRACKERS, Tracker, TrackerFailed, TrackerUnavailable, numbers, register

log = logging.getLogger(__name__)

ENV = "CODEPOST_TRACKING"  # {tracker: what its stage runs attach to}, JSON
STAGE_ENV = "CODEPOST_TRACKING_STAGE"  # the stage running (its folder in the run)
STEP_ENV = "CODEPOST_TRACKING_STEP"  # the run's step when the stage started
STAGE_STEP = "stage/step"  # the stage's own step, logged with each of its points
NOT_TRACKERS = ("base", "trainer")  # this package's modules that register no tracker

# Every tracker here is loaded by name: a stage that reports runs any of them, so its resume key
# holds them all (code_version).
__modules_loaded_by_name__ = True
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in NOT_TRACKERS:
        importlib.import_module(f"{__name__}.{_module.name}")

if TYPE_CHECKING:  # a Literal built from the registry at import time: opaque to type checkers
    TrackerName = str
else:
    TrackerName = Literal[tuple(sorted(TRACKERS))]


def evaluation_metrics(benchmark: str, results: Mapping[str, Any]) -> dict[str, float]:
    """An evaluation's scores (an ``evaluation.json`` record) under the names every tracker
    gets: ``eval/<benchmark>/<greedy|sampled>/pass_at_<k>`` with ``..._ci95_low`` and
    ``..._ci95_high`` (``@`` is not allowed in MLflow's names)."""
    metrics: dict[str, float] = {}
    for run in ("greedy", "sampled"):
        scores = results.get(run) or {}
        for key, value in scores.items():
            if not key.startswith("pass@") or key.endswith("_ci95"):
                continue
            name = f"eval/{benchmark}/{run}/pass_at_{key.removeprefix('pass@')}"
            metrics[name] = value
            interval = scores.get(f"{key}_ci95")
            if interval is not None:
                metrics[f"{name}_ci95_low"], metrics[f"{name}_ci95_high"] = interval
    return numbers(metrics)


def flat_params(config: Mapping[str, Any] | list[Any], prefix: str = "") -> dict[str, str]:
    """A config as ``{"stages.1.config.update.learning_rate": "2e-06", ...}``: what trackers take as
    parameters."""
    flat: dict[str, str] = {}
    items = config.items() if isinstance(config, Mapping) else enumerate(config)
    for name, value in items:
        if isinstance(value, Mapping | list) and value:
            flat.update(flat_params(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = json.dumps(value) if not isinstance(value, str) else value
    return flat


class RunTracking:
    """The run side: each tracker's run for one pipeline run (none when ``report_to`` is
    empty), started as the block ``with RunTracking(...)`` starts and finished, failed if the
    block raised, as it ends; the environment it set is restored then. It keeps the run's
    step (:attr:`step`) whether or not a tracker is asked for."""

    def __init__(self, report_to: list[str], run_dir: Path, config: Mapping[str, Any]) -> None:
        folder, name = Path(run_dir) / "tracking", Path(run_dir).resolve().name
        params = flat_params(config)
        self.runs: dict[str, Tracker] = {}
        self._attach: dict[str, Any] = {}
        for tracker in report_to:
            self.runs[tracker], self._attach[tracker] = TRACKERS[tracker].start_run(
                folder, name, params
            )
        self.step = 0  # the run's step: the updates its stages have made so far
        self._made_at: dict[str, int] = {}  # evaluated model -> the run's step when it was made
        self._saved_env = os.environ.get(ENV)
        self.failures: list[str] = []  # each tracker that failed: where, and why
        if self._attach:
            os.environ[ENV] = json.dumps(self._attach)
            log.info("tracking: %s (%s)", ", ".join(report_to), folder)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """The stage running inside this block is ``name`` (its folder in the run), started at
        the run's step: the stage side nests its runs under that name and logs from there."""
        saved = {variable: os.environ.get(variable) for variable in (STAGE_ENV, STEP_ENV)}
        os.environ.update({STAGE_ENV: name, STEP_ENV: str(self.step)})
        try:
            yield
        finally:
            for variable, value in saved.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value

    def made(self, checkpoint: str | None) -> None:
        """The stage that just ran made ``checkpoint`` (None: none): the run's step moves on by
        the updates its manifest counts (a reused checkpoint's too, so a resumed run keeps its
        steps)."""
        if checkpoint is not None and is_published(Path(checkpoint)):
            self.step += read_manifest(Path(checkpoint)).steps

    def log_evaluation(self, model: str, benchmark: str, evaluation: Path) -> None:
        """Log an evaluation (its folder) of ``model`` (``base``, or the stage that trained
        it) at the run's step when the model was made: the first evaluation of a model comes
        right after the stage that made it."""
        step = self._made_at.setdefault(model, self.step)
        if not self.runs:
            return
        results = json.loads((Path(evaluation) / "evaluation.json").read_text())
        metrics = evaluation_metrics(benchmark, results)
        self._each(lambda run: run.log(metrics, step=step))

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Metrics of the run as a whole (a nightly's promotion decision), at the run's last
        step."""
        self._each(lambda run: run.log(dict(metrics), step=self.step))

    def log_artifacts(self, paths: list[Path]) -> None:
        """The run's files (the report, plots)."""
        self._each(lambda run: run.log_artifacts(sorted(path for path in paths if path.is_file())))

    def _each(self, act: Callable[[Tracker], None]) -> None:
        """``act`` on each tracker's run; one that fails is left out from then on, the stages'
        side too (the variable they read)."""
        for tracker, run in list(self.runs.items()):
            try:
                act(run)
            except Exception as exc:  # whatever its library raises: a full disk, a server gone
                self.failures.append(_failed(tracker, run, exc, "the run goes on without it"))
                del self.runs[tracker], self._attach[tracker]
                os.environ[ENV] = json.dumps(self._attach)

    def __enter__(self) -> RunTracking:
        return self

    def __exit__(self, kind: type[BaseException] | None, *details: object) -> None:
        """Finish every run (failed when the block raised), the stages' this process opened
        first."""
        close_stage_runs(failed=kind is not None)
        self._each(lambda run: run.finish(failed=kind is not None))
        self.runs = {}
        if self._saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved_env
        if self.failures:
            log.error("tracking: this run's records are incomplete: %s", "; ".join(self.failures))


_stage_runs: dict[str, Tracker] = {}
_stage_open: tuple[str, str] | None = None  # (trackers, stage) of _stage_runs


def _stage_trackers() -> dict[str, Tracker]:
    """This process's runs of the stage running (opened on first use; those of the stage
    before closed); none when no tracker was asked for, or on a rank other than the first."""
    global _stage_open
    attach, name = os.environ.get(ENV), os.environ.get(STAGE_ENV)
    if not attach or not name or os.environ.get("RANK", "0") != "0":
        return {}
    if _stage_open != (attach, name):
        close_stage_runs()
        for tracker, info in json.loads(attach).items():
            _stage_runs[tracker] = TRACKERS[tracker].start_stage(info, name)
        _stage_open = (attach, name)
        on_close(close_stage_runs)
    return _stage_runs


def close_stage_runs(failed: bool = False) -> None:
    """Finish the stage runs this process opened (the stage worker does when it ends)."""
    global _stage_open
    _stage_open = None
    _stage_each(lambda run: run.finish(failed))
    _stage_runs.clear()


def log_stage_metrics(metrics: Mapping[str, Any], step: int) -> None:
    """Log a stage's metrics (RL: an iteration's ``metrics.jsonl`` row) at its own ``step``
    (RL: the iteration; a trainer: its global step) to its runs, at the run's step: the one the
    stage started at plus ``step``."""
    if _stage_trackers():  # opened on first use
        values = {**numbers(metrics), STAGE_STEP: float(step)}
        run_step = int(os.environ.get(STEP_ENV, "0")) + step
        _stage_each(lambda run: run.log(values, run_step))


def _stage_each(act: Callable[[Tracker], None]) -> None:
    """``act`` on each of the stage's runs; one that fails is left out for the rest of the
    stage (the stage's log says so; the run's own records go on)."""
    for tracker, run in list(_stage_runs.items()):
        try:
            act(run)
        except Exception as exc:  # whatever its library raises: a full disk, a server gone
            _failed(tracker, run, exc, f"stage {os.environ.get(STAGE_ENV)} goes on without it")
            del _stage_runs[tracker]


def _failed(tracker: str, run: Tracker, exc: Exception, then: str) -> str:
    """Report a tracker's failure on one line, naming where it writes; the line."""
    first = (str(exc).strip().splitlines() or [repr(exc)])[0]  # not the SQL of a store's error
    line = f"{tracker} failed, {run.where}: {first}"
    log.error("tracking: %s; %s", line, then)
    return line


__all__ = [
    "ENV",
    "STAGE_ENV",
    "STAGE_STEP",
    "STEP_ENV",
    "TRACKERS",
    "RunTracking",
    "Tracker",
    "TrackerFailed",
    "TrackerName",
    "TrackerUnavailable",
    "close_stage_runs",
    "evaluation_metrics",
    "flat_params",
    "log_stage_metrics",
    "register",
]
