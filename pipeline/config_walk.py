"""Settings found at any depth of a config: a run checks each outside service its stages and
evaluations need (Docker engines, a sample server) before it starts, not when a stage reaches
it an hour in."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)


def settings_of(config: Any, kind: type[T]) -> list[T]:
    """Every distinct ``kind`` in ``config`` (models, dicts and lists, walked depth first)."""
    if isinstance(config, kind):
        return [config]
    if isinstance(config, BaseModel):
        children: Any = [getattr(config, name) for name in type(config).model_fields]
    elif isinstance(config, dict):
        children = list(config.values())
    elif isinstance(config, list | tuple):
        children = list(config)
    else:
        return []
    found: list[T] = []
    for child in children:
        found += [s for s in settings_of(child, kind) if s not in found]
    return found
