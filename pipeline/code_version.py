"""The code a stage runs, for its resume key: every module of the package that the stage's
module imports, directly or through others, and the ``__init__`` of every package on the way,
each hashed on its own, so that a changed key can say which file changed.

Read from the import statements, as written (those inside functions too: code the stage may
run), not from what this process happens to have imported: editing a loss in
``pipeline/rl/algorithms.py`` changes the key of the ``rl`` stage, and editing the ``sft``
stage's module does not. The whole package's source would be simpler, but then any edit
anywhere (a command's help text, the sandbox server) would recompute every stage of every run.

A plug-in package, whose modules are loaded by name at run time rather than imported (test
forms, record schemas, trackers, the sandbox's languages), says so in its ``__init__.py`` with
:data:`MARKER` (``__modules_loaded_by_name__ = True``): a stage that reaches the package runs
any of them, so all of them, and what they import, are part of its code. A user's new plug-in
package needs only that line. The stage registry (``pipeline/stages``) loads every stage module
by name too, but is deliberately not marked: one stage's code is no part of another's key, and a
stage that runs another's code imports it (``rl`` imports ``rollouts``), which is followed. The
sandbox runner (``sandbox/runner``) runs inside the image: a stage that runs programs keys the
runner's source version with the image's id (``SandboxSettings.content_digests``); of the
runner, only the languages are read by the host too, and keyed as a plug-in package.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

from ..verifiers.python_ast import parse_python

PACKAGE = "codepost"
ROOT = Path(__file__).resolve().parents[1]  # the package's folder: codepost/pipeline/..
MARKER = "__modules_loaded_by_name__"


def code_files(source: Path) -> dict[str, str]:
    """``source`` and every package module it imports, directly or through others: their paths
    (relative to the package root) -> the SHA-256 of their bytes."""
    source = Path(source).resolve()
    found: dict[Path, None] = {}
    pending = [source, *_packages_of(source)]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found[path] = None
        imports, plug_ins = _read(path, *_stat(path))
        pending += imports
        if plug_ins:  # listed now, not with the cached read: a new plug-in module counts
            pending += _modules_of(path.parent)
    return {_relative(path): _sha256(path, *_stat(path)) for path in sorted(found)}


def code_digest(files: dict[str, str]) -> str:
    """One digest of :func:`code_files`' answer."""
    payload = "".join(f"{name}:{sha}\n" for name, sha in sorted(files.items()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _stat(path: Path) -> tuple[int, int]:
    """What says a file changed since it was read: the cache below is keyed by it."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=1024)
def _sha256(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=1024)
def _read(path: Path, mtime_ns: int, size: int) -> tuple[list[Path], bool]:
    """The package's files that ``path`` imports (with the packages they are in), and whether
    it is the ``__init__.py`` of a plug-in package (:data:`MARKER` set at its top level)."""
    tree = parse_python(path.read_bytes())
    plug_ins = path.name == "__init__.py" and any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == MARKER for target in node.targets)
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
        for node in tree.body
    )
    return _imports(path, tree), plug_ins


def _imports(path: Path, tree: ast.Module) -> list[Path]:
    """The package's files that ``path`` (parsed: ``tree``) imports, with their packages."""
    module = _module_name(path)
    files: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node.level, node.module)
            if base is None:
                continue
            # `from . import atomic` imports a module; `from .x import name` a name of one
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            file = _file_of(name)
            if file is not None:
                files += [file, *_packages_of(file)]
    return files


def _modules_of(folder: Path) -> list[Path]:
    """The modules of the package in ``folder`` as ``pkgutil.iter_modules`` lists them: its
    ``.py`` files and its sub-packages' ``__init__.py``."""
    modules = [path for path in folder.glob("*.py") if path.name != "__init__.py"]
    modules += [
        path / "__init__.py" for path in folder.iterdir() if (path / "__init__.py").is_file()
    ]
    return sorted(modules)


def _module_name(path: Path) -> str | None:
    """``path``'s dotted module name when it is in the package; None outside it."""
    try:
        parts = path.relative_to(ROOT).with_suffix("").parts
    except ValueError:
        return None
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _absolute(module: str | None, path: Path, level: int, name: str | None) -> str | None:
    """The absolute module of an ``ImportFrom`` in ``module`` (None: outside the package)."""
    if level == 0:
        return name
    if module is None:
        return None
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - level + 1]
    return ".".join([*base, name] if name else base)


def _file_of(name: str) -> Path | None:
    """The file of module ``name`` when it is a module of the package (not a name in one)."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    folder = ROOT.joinpath(*parts[1:])
    for file in (folder / "__init__.py", folder.with_suffix(".py")):
        if file.is_file():
            return file
    return None


def _packages_of(path: Path) -> list[Path]:
    """The ``__init__.py`` of every package holding ``path``, up to the package root: Python
    runs them before the module."""
    inits = []
    folder = path.parent
    while folder == ROOT or ROOT in folder.parents:
        init = folder / "__init__.py"
        if init.is_file() and init != path:
            inits.append(init)
        folder = folder.parent
    return inits


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
