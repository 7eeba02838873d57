"""The machine a benchmark ran on, for the line every benchmark prints with its figures:
absolute speeds differ a lot between machines, so a figure is read with its CPU and load."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def describe() -> str:
    """``cpu: NAME, N cores, load L`` (the 1-minute load average, now)."""
    return f"cpu: {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
