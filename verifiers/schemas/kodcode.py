"""KodCode: ``question_id``, ``question``, ``solution``, ``test`` (a pytest module that
imports the solution as ``solution``), ``test_info`` (the functions under test)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import Schema, first, register


def fields(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    info = record.get("test_info") or []
    names = [
        str(item["function_name"])
        for item in info
        if isinstance(item, Mapping) and str(item.get("function_name") or "").isidentifier()
    ]
    return {
        "task_id": first(record, ("question_id", "task_id")),
        "prompt": record["question"],
        "canonical_solution": record["solution"],
        "entry_point": names[0] if names else None,
        "tests": {"form": "pytest", "test_file": record["test"], "entry_points": names},
    }


register(
    Schema(
        name="kodcode",
        matches=lambda record: {"question", "solution", "test"} <= record.keys(),
        fields=fields,
        follows="KodCode/KodCode-V1 (and -SFT, -Light-RL)",
    )
)
