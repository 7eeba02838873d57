"""The series report: a table of every night (where it started, the gate's numbers, the
decision) and a plot of the gate benchmark's pass@1 with its 95% interval, champion and night
side by side, promotions marked; ``report.md`` and ``history.png`` in the series folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..reporting.plots import plot_curves
from ..reporting.report import format_p_value
from .records import Decision, NightRecord

REPORT_FILE = "report.md"
PLOT_FILE = "history.png"


def write_history(series_dir: Path, records: list[NightRecord]) -> Path:
    """Write the report of ``records`` (oldest first) and its plot; returns the report."""
    series_dir = Path(series_dir)
    series = records[0].series if records else series_dir.name
    lines = [
        f"# Series {series}",
        "",
        f"{len(records)} night(s), {sum(_promoted(r) for r in records)} promotion(s). The gate "
        "compares each night's checkpoint with the champion it started from, on the same "
        "problems (paired test), one-sided at the night's share of the series' alpha.",
        "",
        f"![pass@1 over the nights]({PLOT_FILE})",
        "",
        "| night | started from | gate: champion -> night (95% CI) | Δ, +gained/-lost, p "
        "| one-sided p vs level (n-th night against the champion) | guards: Δ, p of worse by "
        "the margin | decision |",
        "|---|---|---|---|---|---|---|",
    ]
    for record in records:
        decision = record.decision
        gate = decision.gate if decision else None
        spend = decision.spend if decision else None
        scores = changes = tested = ""
        if gate is not None and spend is not None:
            tested = f"{gate.p_gain:.3g} vs {spend.level:.3g} ({spend.test})"
        if gate is not None:
            scores = f"{gate.champion:.4f} {_ci(gate.champion_ci95)} -> {gate.night:.4f} " + _ci(
                gate.night_ci95
            )
            counts = f", +{gate.gained}/-{gate.lost}" if gate.gained is not None else ""
            changes = f"{gate.difference:+.4f}{counts}, p={format_p_value(gate.p_value)}"
        guards = (
            "; ".join(
                f"{g.benchmark} {g.difference:+.4f} p={_p(g.noninferiority_p)}"
                for g in decision.guards
            )
            if decision
            else ""
        )
        lines.append(
            f"| {record.night} | `{record.started_from}` | {scores} | {changes} | {tested} "
            f"| {guards} | {_cell(_verdict(decision))} |"
        )
    champion = next((r.decision.champion for r in reversed(records) if r.decision), None)
    if champion is not None:
        lines += ["", f"Champion now: `{champion}`."]
    _plot(records, series_dir / PLOT_FILE)
    return write_text(series_dir / REPORT_FILE, "\n".join(lines) + "\n")


def _plot(records: list[NightRecord], path: Path) -> None:
    rows: list[dict[str, Any]] = []
    benchmark = ""
    for record in records:
        gate = record.decision.gate if record.decision else None
        row: dict[str, Any] = {"night": record.night}
        if gate is not None:
            benchmark = gate.benchmark
            row |= {"champion": gate.champion, "champion_ci95": gate.champion_ci95}
            row |= {"night's checkpoint": gate.night, "night's checkpoint_ci95": gate.night_ci95}
        rows.append(row)
    plot_curves(
        rows,
        path,
        x="night",
        panels={f"{benchmark} pass@1, 95% interval": ["champion", "night's checkpoint"]},
        title="the series, night by night",
        error_bars=True,
        y_from_zero=True,
        marks={"promoted": [r.night for r in records if _promoted(r)]},
    )


def _verdict(decision: Decision | None) -> str:
    if decision is None:
        return "not decided (running or killed)"
    if decision.promoted:
        return f"**promoted**: {decision.reason}"
    if decision.promoting:
        return f"promoting, the tag not moved yet (the next night settles it): {decision.reason}"
    return f"kept the champion: {decision.reason}"


def _promoted(record: NightRecord) -> bool:
    return record.decision is not None and record.decision.promoted


def _p(p_value: float | None) -> str:
    return "-" if p_value is None else format_p_value(p_value)


def _ci(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
