"""The stages of a post-training run, one module each (``run_...(config, paths)``), each
registered in :mod:`.registry` with what it needs and makes. Importing this package registers
them all."""

from . import difficulty_filter, dpo, evaluation, pairs, rl, rollouts, sft
from .registry import STAGES, Artifacts, Stage, get_stage, run_stage

__all__ = [
    "STAGES",
    "Artifacts",
    "Stage",
    "difficulty_filter",
    "dpo",
    "evaluation",
    "get_stage",
    "pairs",
    "rl",
    "rollouts",
    "run_stage",
    "sft",
]
