"""Judge side of pytest test files: run a trusted test module with pytest, in the judge.

The test module ``from solution import f`` gets a module whose attributes are the program's
top-level names through the judge's RPC (``__remote__``): the program runs in its own process
as always, and pytest, its plugins, its assertion rewriting and its reports all live in the
judge, where the program cannot reach them. What the program writes (a ``conftest.py``, a
``pytest.ini``, files under ``/work`` or ``/tmp``) is never read: the test module is compiled
from memory, no configuration file or conftest is loaded, and pytest runs from ``/`` (read-only).
One outcome per test function (a parametrized function passes when all its cases pass).

rllm's KodCode reward and KodCode's own harness write ``solution.py`` beside the test file and
run ``pytest`` in one process with the program, judging by its exit status: there the program
can patch pytest, drop a ``conftest.py`` or exit with status 0. Standard library and pytest only.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import linecache
import os
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .judge import is_candidate_failure

# Debian's python3-pytest in the sandbox image (Dockerfile.sandbox); the judge runs with -I -S.
PYTEST_PATHS = ("/usr/lib/python3/dist-packages",)
# pytest options: nothing read from or written to a file system the program can write to.
PYTEST_ARGS = (
    "-c",
    os.devnull,  # no configuration file: not even one the program left in the working directory
    "--rootdir=/",
    "--noconftest",
    "--capture=sys",  # capsys works; fd capture would write temporary files
    "-q",  # the report goes to the judge's stdout, /dev/null
)
# Plugins a judge has no use for; tmpdir's tmp_path would be the judge's own directory, which
# the program cannot read. Each costs start-up time on every job.
BLOCKED_PLUGINS = (
    "cacheprovider",
    "debugging",
    "doctest",
    "faulthandler",
    "junitxml",
    "legacypath",
    "nose",
    "pastebin",
    "python_path",
    "setuponly",
    "setupplan",
    "stepwise",
    "threadexception",
    "tmpdir",
    "unraisableexception",
)
# Names ``from solution import *`` never binds: pytest reads them from a test module (marks,
# set-up functions, tests) and a program's objects must not become the test's own.
SPECIAL_PREFIXES = ("test", "Test", "pytest", "setup", "teardown", "setUp", "tearDown")


def import_pytest() -> Any:
    for path in PYTEST_PATHS:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    import pytest

    return pytest


def solution_module(
    name: str,
    remote: Callable[[str], Any],
    remote_names: Callable[[], list[str]],
    keep: Callable[[str], bool],
) -> types.ModuleType:
    """``name`` as the test module imports it: each attribute is the program's top-level name
    (plain data or a reference), ``import *`` binds the names ``keep`` allows."""
    module = types.ModuleType(name)

    def attribute(attr: str) -> Any:
        if attr == "__all__":
            return [n for n in remote_names() if keep(n)]
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return remote(attr)
        except NameError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


def star_filter(bound: Iterable[str], entry_points: Iterable[str]) -> Callable[[str], bool]:
    """Which program names ``from solution import *`` may bind: not a name the test module
    binds itself (its imports and definitions win, wherever they are), not a builtin the
    tests use as such (a program's ``sorted`` must not judge its own answers) unless it is
    a function under test, never a name pytest treats specially."""
    bound, entry_points = frozenset(bound), frozenset(entry_points)

    def keep(name: str) -> bool:
        if name in entry_points:
            return True
        return not (name in bound or hasattr(builtins, name) or name.startswith(SPECIAL_PREFIXES))

    return keep


def function_key(item: Any) -> str:
    """``test_f`` or ``TestClass::test_f``: one key per test function, parameters dropped."""
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    cls = getattr(item, "cls", None)
    return f"{cls.__name__}::{name}" if cls is not None else name


class Outcomes:
    """A pytest plugin that keeps, per test function, the first failure: the exception itself
    where there is one, so that an exception the program raised stays the program's."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}  # node id -> test function
        self.seen: set[str] = set()
        self.failures: dict[str, BaseException] = {}
        self.first_failure: dict[str, Any] = {}  # test function -> its first failed report
        self.collection_error: BaseException | None = None

    def pytest_itemcollected(self, item: Any) -> None:
        self.keys[item.nodeid] = function_key(item)

    def pytest_runtest_logreport(self, report: Any) -> None:
        key = self.keys.get(report.nodeid, report.nodeid)
        self.seen.add(key)
        if report.failed and key not in self.failures:
            text = report.longreprtext[-2000:] or f"{report.when} failed"
            self.failures[key] = AssertionError(text)
            self.first_failure[key] = report

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed and self.collection_error is None:
            text = report.longreprtext[-2000:]
            self.collection_error = AssertionError(f"the test file did not load: {text}")

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        """After the report: the exception behind it replaces its text."""
        if call.excinfo is None:
            return
        if report.when == "collect":
            self.collection_error = self.collection_error or call.excinfo.value
            return
        key = self.keys.get(report.nodeid, report.nodeid)
        exc = call.excinfo.value
        if self.first_failure.get(key) is report and (
            isinstance(exc, AssertionError) or is_candidate_failure(exc)
        ):
            self.failures[key] = exc


def run_test_file(
    source: str,
    *,
    filename: str,
    module: str,
    bound: Iterable[str],
    entry_points: Iterable[str],
    remote: Callable[[str], Any],
    remote_names: Callable[[], list[str]],
) -> Callable[[str], None]:
    """Run the test module ``source`` with pytest against the program; returns the check of
    one test function: it returns when the function passed and raises its failure otherwise
    (a function pytest did not run fails too, naming why)."""
    pytest = import_pytest()
    solution = solution_module(module, remote, remote_names, star_filter(bound, entry_points))
    path = Path("/") / filename
    outcomes = Outcomes()

    class TrustedModule(pytest.Module):  # type: ignore[misc, name-defined]
        """The test module compiled from ``source`` (asserts rewritten as pytest does), never
        imported from a file."""

        def _getobj(self) -> types.ModuleType:
            tree = ast.parse(source, str(path))
            with contextlib.suppress(Exception):  # plain asserts if pytest's rewriter changes
                from _pytest.assertion.rewrite import rewrite_asserts

                rewrite_asserts(tree, source.encode(), str(path), self.config)
            code = compile(tree, str(path), "exec", dont_inherit=True)
            linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
            test_module = types.ModuleType(path.stem)
            test_module.__file__ = str(path)
            exec(code, test_module.__dict__)
            return test_module

    class Collection:
        @pytest.hookimpl(tryfirst=True)
        def pytest_collection(self, session: Any) -> bool:
            test_module = TrustedModule.from_parent(session, path=path)
            session.items = list(session.genitems(test_module))
            session.testscollected = len(session.items)
            hook = session.config.hook
            hook.pytest_collection_modifyitems(
                session=session, config=session.config, items=session.items
            )
            hook.pytest_collection_finish(session=session)
            return True

    saved_modules = {name: sys.modules.get(name) for name in (module,)}
    saved_cwd = os.getcwd()
    saved_env = {name: os.environ.pop(name, None) for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.modules[module] = solution
    try:
        os.chdir("/")
        blocked = [arg for name in BLOCKED_PLUGINS for arg in ("-p", f"no:{name}")]
        pytest.main([*PYTEST_ARGS, *blocked], plugins=[Collection(), outcomes])
    finally:
        os.chdir(saved_cwd)
        for name, old in saved_modules.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
        for name, value in saved_env.items():
            if value is not None:
                os.environ[name] = value
        linecache.cache.pop(str(path), None)

    def check(key: str) -> None:
        if key in outcomes.failures:
            raise outcomes.failures[key]
        if key not in outcomes.seen:
            raise outcomes.collection_error or AssertionError(f"pytest did not run {key}")

    return check
