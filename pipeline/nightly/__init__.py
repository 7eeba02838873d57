"""Nightly training that moves the model forward: a series of runs, each night from the
series' champion, a paired test deciding whether the night's checkpoint replaces it, a history
across nights and retention (docs/nightly.md)."""

from .gate import Comparison, GateConfig, Spend, StaleEvaluation, decide
from .records import Decision, NightRecord
from .series import (
    CHAMPION,
    ChampionUnusable,
    NightFailed,
    NightlyConfig,
    champion,
    run_night,
)

__all__ = [
    "CHAMPION",
    "ChampionUnusable",
    "Comparison",
    "Decision",
    "GateConfig",
    "NightFailed",
    "NightRecord",
    "NightlyConfig",
    "Spend",
    "StaleEvaluation",
    "champion",
    "decide",
    "run_night",
]
