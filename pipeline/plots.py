"""Curves people would rather see than read: written as PNG next to the metrics they plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plot_curves(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    x: str,
    panels: Mapping[str, Sequence[str]],
    title: str,
) -> Path:
    """One panel per entry of ``panels`` (panel title -> metric names), each metric of ``rows``
    against ``x`` (numbers, or names such as stages, shown in order); missing or NaN values are
    gaps, not zeros."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here, none needed on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (panel, names) in zip(axes[0], panels.items(), strict=True):
        for name in names:
            points = [
                (row[x], row[name])
                for row in rows
                if isinstance(row.get(name), int | float) and not math.isnan(row[name])
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_title(panel)
        ax.set_xlabel(x)
        if all(isinstance(row.get(x), int) for row in rows):  # iterations, steps: no 1.5
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
