"""The stages of a post-training run, one module each (``run_...(config, paths)``), each
registered in :mod:`.registry` with what it needs and makes, run under the resume rule of
:mod:`.resume`. Importing this package imports every module in it, so a new stage is one new
module: nothing else names it."""

import importlib
import pkgutil

from .registry import STAGES, Artifacts, Stage, get_stage
from .resume import run_stage

# Loaded by name, but not marked ``__modules_loaded_by_name__`` as plug-in packages are: one
# stage's code is no part of another's resume key (a stage that runs another's imports it).
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["STAGES", "Artifacts", "Stage", "get_stage", "run_stage"]
