"""Curves people would rather see than read: written as PNG next to the metrics they plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import staged


def plot_curves(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    x: str,
    panels: Mapping[str, Sequence[str]],
    title: str,
    error_bars: bool = False,
    y_from_zero: bool = False,
    marks: Mapping[str, Sequence[Any]] | None = None,
) -> Path:
    """One panel per entry of ``panels`` (panel title -> metric names), each metric of ``rows``
    against ``x`` (numbers, or names such as stages, shown in the order of ``rows``); missing or
    NaN values are gaps, not zeros. ``error_bars``: a row's ``<metric>_ci95`` (low, high), when
    there, is drawn around the point. ``y_from_zero``: the y axis starts at 0, so that a small
    difference does not look like a large one. ``marks``: a label -> the x values marked with a
    vertical line in every panel (a series' promotions)."""
    # matplotlib loads when a plot is drawn, on the file backend chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here, none needed on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names_on_x = not all(isinstance(row.get(x), int | float) for row in rows)
    # names are placed by position: matplotlib would order them as each line first meets them
    labels = list(dict.fromkeys(row.get(x) for row in rows)) if names_on_x else []
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (panel, names) in zip(axes[0], panels.items(), strict=True):
        for series, name in enumerate(names):
            # side by side around each name, so that the error bars of series do not hide
            dodge = (series - (len(names) - 1) / 2) * 0.05 if names_on_x and error_bars else 0
            points = [
                (labels.index(row.get(x)) + dodge if names_on_x else row[x], row[name], row)
                for row in rows
                if isinstance(row.get(name), int | float) and not math.isnan(row[name])
            ]
            if not points:
                continue
            xs, ys, used = zip(*points, strict=True)
            if error_bars:
                below, above = zip(*(_error(row, name) for row in used), strict=True)
                ax.errorbar(xs, ys, yerr=[below, above], marker="o", capsize=3, label=name)
            else:
                ax.plot(xs, ys, marker="o", label=name)
        for color, (label, xs_marked) in enumerate((marks or {}).items()):
            for i, value in enumerate(xs_marked):
                where = labels.index(value) if names_on_x else value
                ax.axvline(where, color=f"C{color + len(names)}", linestyle="--", alpha=0.6,
                           label=label if i == 0 else None)  # fmt: skip
        ax.set_title(panel)
        ax.set_xlabel(x)
        if names_on_x:
            ax.set_xticks(range(len(labels)), [str(label) for label in labels])
        elif all(isinstance(row.get(x), int) for row in rows):  # iterations, steps: no 1.5
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if y_from_zero:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    with staged(path) as staging:
        fig.savefig(staging, dpi=110, format="png")
    plt.close(fig)
    return path


def _error(row: Mapping[str, Any], name: str) -> tuple[float, float]:
    """How far the interval ``<name>_ci95`` of ``row`` reaches below and above its value (none
    drawn when the row has no interval)."""
    interval = row.get(f"{name}_ci95")
    if not interval:
        return (0.0, 0.0)
    low, high = interval
    return (max(0.0, row[name] - low), max(0.0, high - row[name]))
