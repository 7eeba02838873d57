"""Import a script of ``benchmarks/`` as Python runs it: with its folder first on ``sys.path``,
so that its imports of sibling modules (``machine``, ``verify_end_to_end``) resolve."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)
