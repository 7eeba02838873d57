"""A user's own function by import path, so that a reward term, an advantage estimator or a
policy loss needs no fork of codepost (prime-rl's ``CustomLossConfig``, TRL's dotted paths).

A config names it as ``{import_path: "package.module:function", kwargs: {...}}``. It is imported
and its keywords bound to its signature when the config is validated, so a misspelt path or
keyword fails at load time, naming itself, not mid-run. The function is called with the
arguments of its kind first, then ``kwargs``. Its module file's digest is part of the resume
key (:meth:`Plugin.source_digest`): an edited function does not reuse outputs made by the old.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


@functools.cache
def load_function(import_path: str) -> Callable[..., Any]:
    """The function at ``package.module:function`` (``function`` may be dotted: a class's
    static method); a ``ValueError`` naming what is missing otherwise."""
    module_name, colon, attribute = import_path.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"import_path {import_path!r} is not 'package.module:function'")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"import_path {import_path!r}: cannot import {module_name!r} ({exc})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"import_path {import_path!r}: {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"import_path {import_path!r} is a {type(found).__name__}, not callable")
    return found


class Plugin(BaseModel):
    """A function by import path and the keywords it is called with; each kind says how many
    arguments codepost passes before the keywords (:meth:`arguments`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    import_path: str = Field(description="package.module:function")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keywords the function is called with"
    )

    @model_validator(mode="after")
    def _loads(self) -> Plugin:
        fn = load_function(self.import_path)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: checked when called
            return self
        try:
            signature.bind(*range(self.arguments()), **self.kwargs)
        except TypeError as exc:
            raise ValueError(
                f"{self.import_path} does not take ({self.arguments()} arguments, "
                f"kwargs {sorted(self.kwargs)}): {exc}"
            ) from None
        return self

    def arguments(self) -> int:
        """How many positional arguments codepost passes (each kind overrides it)."""
        raise NotImplementedError

    @property
    def function(self) -> Callable[..., Any]:
        return load_function(self.import_path)

    def source_digest(self) -> dict[str, str]:
        """``{"plug-in <import path>": sha256 of its module's file}`` (nothing for a module with
        no file of its own)."""
        try:
            path = inspect.getsourcefile(inspect.getmodule(self.function) or self.function)
        except TypeError:
            return {}
        if path is None:
            return {}
        with open(path, "rb") as source:
            digest = hashlib.file_digest(source, "sha256").hexdigest()
        return {f"plug-in {self.import_path}": digest}
