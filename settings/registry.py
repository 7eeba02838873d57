"""Named plug-ins of one kind, in one class for every kind: stages, advantage estimators,
policy losses, algorithms, test forms, record schemas, environments, trackers, reward terms.

A name registers once (a module imported again may register the same entry again), and an
unknown name fails naming the known ones. With ``package``, each module of that package is
imported on the first look-up, so a built-in entry is a module that registers itself on
import and nothing else names it."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    def __init__(self, kind: str, package: str | None = None) -> None:
        """``kind`` names an entry in messages (``test form``)."""
        super().__init__()
        self.kind, self.package = kind, package
        self._loaded = package is None
        self._loading = threading.RLock()  # first look-ups from several threads wait for one

    def register(self, name: str, entry: T) -> T:
        if name in self and self[name] != entry:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self[name] = entry
        return entry

    def all(self) -> dict[str, T]:
        """Every registered one by name, the package's own modules imported first."""
        self._load()
        return dict(self)

    def __missing__(self, name: str) -> T:
        if not self._loaded:
            self._load()
            if name in self:
                return self[name]
        raise ValueError(f"unknown {self.kind} {name!r} (known: {', '.join(sorted(self))})")

    def _load(self) -> None:
        with self._loading:  # reentrant: a module being imported may look up the registry
            if self._loaded or self.package is None:
                return
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{module.name}")
            self._loaded = True
