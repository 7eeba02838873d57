"""Named plug-ins of one kind (test forms, record schemas): each built-in one is a module of
its package, imported on the first look-up, and any other module registers its own."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str) -> None:
        self.kind, self.package = kind, package
        self._items: dict[str, T] = {}
        self._imported = False
        self._importing = threading.RLock()  # first look-ups from several threads wait for one

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._items[name] = item
        return item

    def all(self) -> dict[str, T]:
        """Every registered one by name, the package's own modules imported first."""
        with self._importing:  # reentrant: a module being imported may look up the registry
            if not self._imported:
                package = importlib.import_module(self.package)
                for module in pkgutil.iter_modules(package.__path__):
                    importlib.import_module(f"{self.package}.{module.name}")
                self._imported = True
        return dict(self._items)

    def get(self, name: str) -> T:
        known = self.all()
        if name not in known:
            raise ValueError(f"unknown {self.kind} {name!r} (known: {', '.join(known)})")
        return known[name]
