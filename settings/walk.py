"""Settings found at any depth of a config: a run checks each outside service its stages and
evaluations need (Docker engines, a sample server) before it starts, not when a stage reaches
it an hour in; and a stage's resume key holds the content of every outside input its config
names (:class:`OutsideInput`), wherever in the config it is named."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class OutsideInput:
    """Settings that name something outside the config that a stage reads (a problems file, a
    model folder, the sandbox image): the name alone would let a stage reuse an output made
    from other content under the same name. (Not an ABC: :func:`settings_of` takes the class.)"""

    def content_digests(self) -> dict[str, str]:
        """What it names, as the resume rule's log names it (``problems file data/x.jsonl``),
        -> a digest of its content now; nothing for what its name alone says (a hub id)."""
        raise NotImplementedError


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
