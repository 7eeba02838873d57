"""A night of a series: a new run folder, trained from the series' champion, then the promotion
gate, the history and retention. Plain Python; the ``nightly`` flow wraps :func:`run_night`.

The layout of a series folder (its checkpoint catalog: the champion is its tag
``champion``)::

    <root>/<series>/.lock  tags.json  report.md  history.png
    <root>/<series>/<night>/night.json  run.json  report.md  base/eval/...  sft/<key>/ ...

Nights of one series never overlap: the series folder is locked while a night runs, and a
night that finds it locked does not run (:class:`~..run_lock.RunFolderLocked`). A night with a
record whose decision was made is not run again; a failed one is (it resumes its folder).

A promotion is one step as the series sees it: the record says ``promoting`` (the gate's
verdict), the tag moves, then the record says ``promoted``. Every night first settles a night
stopped in between (:func:`_settle`), so a kill there delays a promotion and never loses or
half-makes one. A champion tag that names a checkpoint gone or not matching its manifest stops
the night (:class:`ChampionUnusable`): only a series without the tag starts from the run's model.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from ...settings.config import Settings
from ...settings.walk import settings_of
from ..checkpoints.catalog import TAGS_FILE, read_tags, resolve, tag
from ..checkpoints.manifest import MANIFEST, is_published, verify
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..launch import LaunchingExecutor, execute_launched
from ..post_train import PostTrainConfig, RunResult, embedded_default, run_post_train
from ..reporting.report import load_evaluation
from ..run_lock import run_folder_lock
from ..tracking import RunTracking
from .gate import (
    Comparison,
    GateConfig,
    Spend,
    check_evaluation,
    compare,
    decide,
    same_checkpoint,
)
from .history import write_history
from .records import NIGHT_RECORD, Decision, NightRecord, ProblemsRead, now, read_history
from .retention import prune_nights

log = logging.getLogger("codepost.nightly")
CHAMPION = "champion"
NIGHT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class NightlyConfig(Settings):
    """A series of nightly runs: the run each night makes, the gate, the retention."""

    series: str = Field("nightly", pattern=NIGHT_NAME.pattern, description="the series' name")
    root: str = Field("runs/series", description="series folders go under it")
    gate: GateConfig = Field(default_factory=GateConfig)
    keep_nights: int = Field(
        3, ge=1, description="keep the checkpoints of the last N nights (and the champion)"
    )
    run: PostTrainConfig = Field(
        default_factory=embedded_default,
        description="each night's run: its model is night 1's start (later nights start from "
        "the champion), its run_dir is replaced by the night's folder",
    )

    @model_validator(mode="after")
    def _gate_on_the_runs_evaluations(self) -> NightlyConfig:
        if not self.run.evaluate_base:
            raise ValueError(
                "run.evaluate_base: the gate compares each night with the champion it started "
                "from, evaluated as the night's base: it must be true"
            )
        known = list(self.run.evaluations)
        for name in [self.gate.benchmark, *self.gate.guards]:
            if name is None:
                continue
            if name not in known:
                raise ValueError(f"gate: {name!r} is not one of run.evaluations ({known})")
            evaluation = self.run.evaluations[name]
            if not getattr(evaluation, self.gate.run):
                raise ValueError(f"gate.run={self.gate.run!r}: run.evaluations.{name} has none")
            if self.gate.run == "sampled" and self.gate.k not in evaluation.ks:
                raise ValueError(f"gate.k={self.gate.k}: not in run.evaluations.{name}.ks")
        return self

    @property
    def series_dir(self) -> Path:
        return Path(self.root) / self.series

    @property
    def benchmark(self) -> str:
        return self.gate.benchmark or next(iter(self.run.evaluations))


class NightFailed(RuntimeError):
    """The night failed; its record is written: a decision that kept the champion, or, when
    it failed after its gate promoted, one still promoting (the next night settles it)."""

    def __init__(self, record: NightRecord, error: str | None = None) -> None:
        super().__init__(error or (record.decision.reason if record.decision else "failed"))
        self.record = record


class ChampionUnusable(RuntimeError):
    """The champion tag names a checkpoint that is gone or does not match its manifest: no
    night trains from it or is gated against it, and none falls back to the run's model."""


def champion(series_dir: Path) -> str | None:
    """The champion's folder, checked against its manifest; None when the series has no
    champion tag (before its first promotion). Raises ChampionUnusable naming the tag, or the
    tags file when a night was promoted and the tag is not there (a lost or emptied file)."""
    fix = f"tag another checkpoint {CHAMPION} (codepost checkpoints --root {series_dir} tag)"
    try:
        tagged = read_tags(series_dir).get(CHAMPION)
    except ValueError as exc:
        raise ChampionUnusable(f"{exc}; {fix}") from None
    if tagged is None:
        promoted = [r.night for r in read_history(series_dir) if r.decision and r.decision.promoted]
        if promoted:
            raise ChampionUnusable(
                f"{Path(series_dir) / TAGS_FILE}: no {CHAMPION} tag, yet night "
                f"{promoted[-1]!r} was promoted; {fix}"
            )
        return None
    where = f"{Path(series_dir) / TAGS_FILE}: {CHAMPION} -> {tagged!r}"
    try:
        entry = resolve(series_dir, CHAMPION)
    except LookupError:
        raise ChampionUnusable(f"{where}: no checkpoint there; {fix}") from None
    problems = list(entry.problems) or verify(entry.path)
    if problems:
        raise ChampionUnusable(
            f"{where}: it does not match its manifest ({'; '.join(problems)}); {fix}"
        )
    return str(entry.path)


def problems_read(config: BaseModel) -> list[ProblemsRead]:
    """Every problem set of ``config`` read now: its count and content hash."""
    read = []
    for problem_set in settings_of(config, ProblemSet):
        problems = load_problem_set(problem_set)
        read.append(
            ProblemsRead(
                problems=problem_set.model_dump(mode="json"),
                count=len(problems),
                fingerprint=fingerprint(problems),
            )
        )
    return read


def run_night(
    config: NightlyConfig, night: str, execute: LaunchingExecutor = execute_launched
) -> NightRecord:
    """Night ``night`` of the series: its run from the champion, the gate, the series' history
    and retention. Raises RunFolderLocked when another night of the series is running,
    ChampionUnusable (nothing run) when the champion is, and NightFailed (the record written)
    when the night fails."""
    if not NIGHT_NAME.fullmatch(night):
        raise ValueError(f"night {night!r}: letters, digits, '.', '_' and '-' only")
    series_dir = config.series_dir
    with run_folder_lock(
        series_dir,
        held_by_another="another night of this series is running; this night does not run "
        "(the nights of a series never overlap)",
    ):
        night_dir = series_dir / night
        done = night_dir / NIGHT_RECORD
        previous = NightRecord.read(done) if done.is_file() else None
        if _decided(previous):
            assert previous is not None and previous.decision is not None
            log.info("night %s has run: %s", night, previous.decision.reason)
            return previous
        for stopped in [r for r in read_history(series_dir) if _promoting(r)]:
            settled = _settle(config, stopped)
            if settled.night == night:  # asked again: settling was what it had left to do
                _after_the_night(config)
                if not _decided(settled):
                    raise NightFailed(settled)
                return settled
        start = champion(series_dir) or config.run.model.name_or_path
        first_start = previous.started_at if previous is not None else now()
        record = NightRecord(
            series=config.series, night=night, started_at=first_start, started_from=start
        )
        log.info("night %s of %s from %s", night, config.series, start)
        decided: list[Decision] = []

        def gate(result: RunResult, trackers: RunTracking) -> None:
            decided.append(_gate(config, record, result, previous))
            record.model_copy(update={"decision": decided[0]}).write(night_dir)
            trackers.log_metrics(_metrics(decided[0]))
            trackers.log_artifacts([done])

        try:
            record = record.model_copy(update={"data": problems_read(config.run)})
            record.write(night_dir)
            run = config.run.model_copy(
                update={
                    "run_dir": str(night_dir),
                    "model": config.run.model.model_copy(update={"name_or_path": start}),
                }
            )
            run_post_train(run, execute, then=gate)
            record = record.model_copy(update={"decision": decided[0]})
            if decided[0].promoting:  # the run has ended: the tag moves
                record = _promote(config, record)
        except Exception as exc:
            failed = f"{type(exc).__name__}: {exc}"
            if decided and decided[0].promoting:  # the gate's verdict stands: see _settle
                _after_the_night(config)
                raise NightFailed(
                    record.model_copy(update={"decision": decided[0]}),
                    f"the gate promoted {decided[0].candidate}, then the night failed "
                    f"({failed}); the next night of the series finishes the promotion or "
                    "fails it",
                ) from exc
            record = _failed(config, record, decided[0] if decided else None, failed)
            _after_the_night(config)
            raise NightFailed(record) from exc
        except BaseException as exc:  # cancelled (a flow run's SIGTERM, Ctrl-C): not a failure
            if not decided:  # after the gate, its verdict stands (a promotion: see _settle)
                _cancelled(config, record, type(exc).__name__)
                _after_the_night(config)
            raise
        _after_the_night(config)
    log.info("night %s: %s", night, record.decision.reason if record.decision else "")
    return record


def _decided(record: NightRecord | None) -> bool:
    """A night that is not run again: decided, neither failed, cancelled nor still promoting."""
    decision = record.decision if record is not None else None
    return (
        decision is not None
        and decision.failed is None
        and decision.cancelled is None
        and not decision.promoting
    )


def _promoting(record: NightRecord) -> bool:
    return record.decision is not None and record.decision.promoting


def _failed(
    config: NightlyConfig, record: NightRecord, decision: Decision | None, failed: str
) -> NightRecord:
    """``record`` with a decision that keeps the champion because of ``failed`` (the gate's
    numbers, when it ran, kept), written."""
    kept = {
        "promoted": False,
        "promoting": False,
        "reason": decide(config.gate, None, None, [], failed=failed)[1],
        "champion": record.started_from,
        "failed": failed,
    }
    decision = decision or Decision(alpha=config.gate.alpha, **kept)
    record = record.model_copy(update={"decision": decision.model_copy(update=kept)})
    record.write(config.series_dir / record.night)
    return record


def _cancelled(config: NightlyConfig, record: NightRecord, why: str) -> None:
    """Record ``record``'s night cancelled by ``why`` before its gate: the champion kept, no
    alpha spent; asked again, the night runs (resuming its folder)."""
    decision = Decision(
        promoted=False,
        reason=f"the night was cancelled ({why}) before its gate; asked again, it runs",
        champion=record.started_from,
        alpha=config.gate.alpha,
        cancelled=why,
    )
    record.model_copy(update={"decision": decision}).write(config.series_dir / record.night)


def _promote(config: NightlyConfig, record: NightRecord) -> NightRecord:
    """Move the champion tag to the night's checkpoint, then record the night promoted."""
    decision = record.decision
    assert decision is not None and decision.candidate is not None
    tag(config.series_dir, _in_series(config, decision.candidate), CHAMPION)
    promoted = {"promoted": True, "promoting": False, "champion": decision.candidate}
    record = record.model_copy(update={"decision": decision.model_copy(update=promoted)})
    record.write(config.series_dir / record.night)
    return record


def _settle(config: NightlyConfig, record: NightRecord) -> NightRecord:
    """Finish the promotion of a night stopped after its gate promoted: the tag moves when
    the champion is still the one the gate compared with (or already is the night's
    checkpoint) and that checkpoint still matches its manifest; else the night fails, the
    champion kept, its record saying why."""
    decision = record.decision
    assert decision is not None and decision.candidate is not None
    current = champion(config.series_dir)
    log.info("night %s stopped promoting %s: settling it", record.night, decision.candidate)
    if current is not None and same_checkpoint(current, decision.candidate):
        return _promote(config, record)  # stopped after the tag moved
    start = current or config.run.model.name_or_path
    if not same_checkpoint(start, record.started_from):
        why = f"the champion is now {start}, not {record.started_from} that the gate compared with"
    else:
        why = "; ".join(_unverified(Path(decision.candidate)))
    if not why:
        return _promote(config, record)
    return _failed(config, record, decision, f"its promotion cannot finish: {why}")


def _unverified(checkpoint: Path) -> list[str]:
    """What does not match in ``checkpoint`` against its manifest; empty when it is whole."""
    return verify(checkpoint) if is_published(checkpoint) else [f"{checkpoint}: no {MANIFEST}"]


def _gate(
    config: NightlyConfig, record: NightRecord, result: RunResult, previous: NightRecord | None
) -> Decision:
    """Compare the night's checkpoint with the champion and decide (the tag moves once the
    run has ended)."""
    candidate, start = result.checkpoint, record.started_from
    trained = candidate != start
    problems = _unverified(Path(candidate)) if trained else []
    gate, guards, spend = None, [], None
    if trained and not problems:
        gate = _compare(config.benchmark, config, record, result)
        margin = config.gate.margin
        guards = [_compare(name, config, record, result, margin) for name in config.gate.guards]
        spend = _spend(config, record, previous)
    promoted, reason = decide(
        config.gate, spend, gate, guards, trained=trained, verify_problems=problems
    )
    return Decision(
        promoted=False,
        promoting=promoted,
        reason=reason,
        champion=start,
        candidate=candidate if trained else None,
        alpha=config.gate.alpha,
        spend=spend,
        gate=gate,
        guards=guards,
    )


def _spend(config: NightlyConfig, record: NightRecord, previous: NightRecord | None) -> Spend:
    """The night's share of alpha: the test number it had when it is asked again against the
    same champion (a night never spends twice), else the next after every night of the series
    tested against that champion, whenever they ran (the records outlive retention). A night
    recorded before nights spent alpha counts as one test."""
    if previous is not None and same_checkpoint(previous.started_from, record.started_from):
        had = previous.decision.spend if previous.decision is not None else None
        if had is not None:
            return Spend.of(config.gate.alpha, had.test)
    reign = [
        r.decision
        for r in read_history(config.series_dir)
        if r.night != record.night
        and r.decision is not None
        and same_checkpoint(r.started_from, record.started_from)
    ]
    numbered = [d.spend.test for d in reign if d.spend is not None]
    unnumbered = sum(d.spend is None and d.gate is not None for d in reign)
    return Spend.of(config.gate.alpha, 1 + max([*numbered, unnumbered]))


def _in_series(config: NightlyConfig, checkpoint: str) -> str:
    """``checkpoint``'s folder relative to the series folder (its name in the catalog)."""
    return str(Path(checkpoint).resolve().relative_to(config.series_dir.resolve()))


def _compare(
    benchmark: str,
    config: NightlyConfig,
    record: NightRecord,
    result: RunResult,
    margin: float | None = None,
) -> Comparison:
    """The night's checkpoint against its base (the champion) on ``benchmark`` (with a
    guard's ``margin``), each evaluation checked to be of that checkpoint on the problems the
    night read."""
    folders = result.evaluations[benchmark]
    made_by = next(
        s["name"] for s in reversed(result.stages) if s.get("checkpoint") == result.checkpoint
    )
    problems = _fingerprint_read(config, record, benchmark)
    champion, night = (
        check_evaluation(
            f"{label}/{benchmark}", load_evaluation(Path(folders[label])), checkpoint, problems
        )
        for label, checkpoint in (("base", record.started_from), (made_by, result.checkpoint))
    )
    return compare(benchmark, champion, night, config.gate, margin=margin)


def _fingerprint_read(config: NightlyConfig, record: NightRecord, benchmark: str) -> str | None:
    """The content hash of ``benchmark``'s problems as the night read them at its start; None
    for problems a filter stage made that night (``problems_from``)."""
    evaluation = config.run.evaluations[benchmark]
    if evaluation.problems_from is not None:
        return None
    wanted = evaluation.problems.model_dump(mode="json")
    for read in record.data:
        if read.problems == wanted:
            return read.fingerprint
    raise ValueError(f"gate: the night's record has no problems read for {benchmark}")


def _metrics(decision: Decision) -> dict[str, float]:
    metrics = {"gate/promoted": float(decision.promoting)}  # the verdict: the tag moves next
    if decision.spend is not None:
        metrics |= {"gate/level": decision.spend.level, "gate/spent": decision.spend.spent}
    for comparison in [decision.gate] if decision.gate else []:
        metrics |= {
            "gate/p_value": comparison.p_value,
            "gate/p_gain": comparison.p_gain,
            "gate/difference": comparison.difference,
            "gate/champion": comparison.champion,
            "gate/night": comparison.night,
        }
    for guard in decision.guards:
        metrics |= {
            f"gate/guard/{guard.benchmark}/p_value": guard.p_value,
            f"gate/guard/{guard.benchmark}/difference": guard.difference,
        }
        if guard.noninferiority_p is not None:
            metrics[f"gate/guard/{guard.benchmark}/noninferiority_p"] = guard.noninferiority_p
    return metrics


def _after_the_night(config: NightlyConfig) -> None:
    """The series' report, then retention: the checkpoints of nights past the last N go."""
    history = read_history(config.series_dir)
    write_history(config.series_dir, history)
    pruned = prune_nights(config.series_dir, history, config.keep_nights)
    for entry in pruned:
        log.info("retention: deleted %s (%s)", entry.folder, entry.name)
