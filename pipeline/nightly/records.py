"""What a night leaves in its folder (``night.json``): where it started, the data it read, and
the gate's decision with its numbers. The series' history is these records, oldest first."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..atomic import write_text
from .gate import Comparison, Spend

NIGHT_RECORD = "night.json"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class ProblemsRead(BaseModel):
    """A problem set as the night read it: a file or hub set that grows shows here."""

    model_config = ConfigDict(frozen=True)

    problems: dict[str, Any] = Field(description="the ProblemSet")
    count: int
    fingerprint: str = Field(description="hash of the problems' content")


class Decision(BaseModel):
    """The gate's verdict on a night, whatever it is, with the numbers it was made from.

    A promotion is recorded twice: ``promoting`` when the gate has decided (the tag not moved
    yet), then ``promoted`` once the tag has moved. A night stopped in between (killed) leaves
    ``promoting``, which the next night of the series finishes or fails."""

    model_config = ConfigDict(frozen=True)

    promoted: bool = Field(description="the champion tag moved to the night's checkpoint")
    promoting: bool = Field(
        False, description="the gate promoted the night's checkpoint; the tag has not moved yet"
    )
    reason: str
    champion: str = Field(description="the champion after the night (so far, when promoting)")
    candidate: str | None = Field(None, description="the night's checkpoint")
    alpha: float = Field(description="the series' false-promotion rate")
    spend: Spend | None = Field(
        None, description="the night's share of alpha; None: it tested nothing (or predates it)"
    )
    gate: Comparison | None = None
    guards: list[Comparison] = Field(default_factory=list)
    failed: str | None = Field(None, description="the error that ended a failed night")
    cancelled: str | None = Field(
        None, description="what stopped a night before its gate (a cancel, Ctrl-C)"
    )
    decided_at: str = Field(default_factory=now)


class NightRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    series: str
    night: str
    started_at: str = Field(
        default_factory=now,
        description="when the night first started; a rerun keeps it (the series' order)",
    )
    started_from: str = Field(description="the champion the night trained from")
    data: list[ProblemsRead] = Field(default_factory=list)
    decision: Decision | None = None

    @classmethod
    def read(cls, path: Path) -> NightRecord:
        return cls.model_validate(json.loads(Path(path).read_text()))

    def write(self, night_dir: Path) -> Path:
        return write_text(Path(night_dir) / NIGHT_RECORD, self.model_dump_json(indent=2) + "\n")


def read_history(series_dir: Path) -> list[NightRecord]:
    """Every night of the series that has a record, in the order they first started."""
    records = [NightRecord.read(path) for path in Path(series_dir).glob(f"*/{NIGHT_RECORD}")]
    return sorted(records, key=lambda record: (record.started_at, record.night))
