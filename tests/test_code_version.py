"""The resume key sees the code a stage runs: every module of the package the stage's module
imports, directly or through others, and every module of a plug-in package it reaches. Edit a
loss or how MBPP asserts are judged, and RL computes again, naming the file; edit another
stage, and RL is reused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from package_layout import LAYERS

from codepost.pipeline import code_version
from codepost.pipeline.code_version import MARKER, ROOT, code_files
from codepost.pipeline.stages import get_stage

# The package's folders, as a copy of the package needs them (MBPP's data included).
PACKAGE_PARTS = ("__init__.py", *LAYERS)

RUN_RL_STAGE = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from codepost.pipeline.stages import Artifacts, get_stage, run_stage
from codepost.pipeline.stages.rl import RLConfig

def pretend(stage, config, inputs, out_dir, label):  # the key is the point, not training
    out_dir.mkdir(parents=True)
    (out_dir / "weights.txt").write_text("trained")
    return Artifacts(checkpoint=str(out_dir))

run_stage(get_stage("rl"), RLConfig(), Artifacts(), Path(sys.argv[1]), pretend)
"""


def test_a_stage_s_code_is_its_module_and_what_it_imports():
    rl, sft = get_stage("rl").code_files(), get_stage("sft").code_files()
    assert {"pipeline/stages/rl.py", "pipeline/rl/algorithms.py", "verifiers/rewards.py"} <= set(rl)
    assert "pipeline/stages/sft.py" not in rl  # another stage is no part of it
    assert "pipeline/rl/algorithms.py" not in sft and "pipeline/training.py" in sft
    assert {"__init__.py", "pipeline/__init__.py", "pipeline/stages/__init__.py"} <= set(rl)
    assert all(len(sha) == 64 for sha in rl.values())


def test_a_stage_that_reaches_a_plug_in_package_holds_every_module_of_it():
    """Test forms, record schemas and trackers are loaded by name, never imported by one:
    editing how MBPP asserts are judged left every output that judged them reused."""
    evaluate, rl = get_stage("evaluate").code_files(), get_stage("rl").code_files()
    for package in ("verifiers/forms", "verifiers/schemas"):
        modules = {str(path.relative_to(ROOT)) for path in (ROOT / package).glob("*.py")}
        assert modules <= set(evaluate) and modules <= set(rl)
    assert "verifiers/forms/asserts.py" in evaluate
    assert "pipeline/tracking/wandb.py" in rl  # a stage that reports runs any tracker
    assert "pipeline/stages/rl.py" not in evaluate  # the stage registry stays unmarked
    # A language's fences shape SFT's and DPO's targets, though neither stage runs a program.
    for stage in ("sft", "dpo", "evaluate"):
        assert "sandbox/runner/languages/python.py" in get_stage(stage).code_files(), stage


def test_a_user_s_plug_in_package_is_keyed_whole_and_a_new_module_in_it_counts(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(code_version, "ROOT", tmp_path)  # a package of its own, as codepost
    files = {
        "__init__.py": "",
        "stage.py": "from .plugins import find\n",
        "helpers.py": "ONE = 1\n",
        "plugins/__init__.py": f"{MARKER} = True\n\ndef find(name): ...\n",
        "plugins/first.py": "from ..helpers import ONE\n",
        "plugins/nested/__init__.py": "",
        "unmarked/__init__.py": "def find(name): ...\n",
        "unmarked/other.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    stage = tmp_path / "stage.py"
    keyed = {"__init__.py", "stage.py", "plugins/__init__.py", "plugins/first.py", "helpers.py"}
    assert set(code_files(stage)) == keyed | {"plugins/nested/__init__.py"}

    (tmp_path / "plugins" / "second.py").write_text("TWO = 2\n")  # the __init__ unchanged
    assert "plugins/second.py" in code_files(stage)
    (tmp_path / "stage.py").write_text("from .unmarked import find\n")
    assert set(code_files(stage)) == {"__init__.py", "stage.py", "unmarked/__init__.py"}


# A package that loads its own modules by name, as those of this repository do it.
LOADS_BY_NAME = re.compile(
    r"iter_modules\(__path__\)|Registry\([^)]*__name__\)|listdir\(os\.path\.dirname\(__file__\)\)"
)
# Loaded by name and left unmarked on purpose: one stage's code is no part of another stage's key.
UNMARKED = {"pipeline/stages"}


def test_every_package_that_loads_its_modules_by_name_is_marked_a_plug_in_package():
    inits = [init for layer in LAYERS for init in sorted((ROOT / layer).rglob("__init__.py"))]
    loaders = {
        str(init.parent.relative_to(ROOT)): init.read_text()
        for init in inits
        if LOADS_BY_NAME.search(init.read_text())
    }
    assert {"verifiers/forms", "verifiers/schemas", "pipeline/tracking"} | UNMARKED <= set(loaders)
    unmarked = {name for name, text in loaders.items() if f"\n{MARKER} = True" not in text}
    assert unmarked == UNMARKED


def _run_rl(package: Path, out_root: Path) -> str:
    """The rl stage's resume rule in a fresh process that imports ``package``'s copy."""
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    done = subprocess.run(
        [sys.executable, "-c", RUN_RL_STAGE, str(out_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("rl: ")]
    return line


@pytest.mark.docker  # the rl stage's key holds the sandbox image's id
@pytest.mark.slow
def test_an_edited_loss_or_test_form_recomputes_rl_and_the_log_names_the_file(tmp_path):
    package = tmp_path / "copy" / "codepost"
    for part in PACKAGE_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, package / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            package.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, package / part)
    out_root = tmp_path / "runs" / "rl"

    assert "computing" in _run_rl(package, out_root)

    # A stage the rl stage does not import: still the same key.
    sft = package / "pipeline" / "stages" / "sft.py"
    sft.write_text(sft.read_text().replace('"""SFT warm start', '"""The SFT warm start', 1))
    assert "reusing" in _run_rl(package, out_root)

    # A function of a module it imports through the policy update: a new key, and why.
    algorithms = package / "pipeline" / "rl" / "algorithms.py"
    source = algorithms.read_text()
    edited = source.replace(
        "    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))\n",
        "    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)) * 1.0\n",
        1,
    )
    assert edited != source
    algorithms.write_text(edited)
    line = _run_rl(package, out_root)
    assert "computing" in line, line
    assert "the stage's code changed: pipeline/rl/algorithms.py" in line, line
    assert len(list(out_root.glob("*.json"))) == 2  # beside the first output, not over it

    # How MBPP's asserts are judged: a module no import statement names.
    asserts = package / "verifiers" / "forms" / "asserts.py"
    asserts.write_text(asserts.read_text() + "\n# judged otherwise\n")
    line = _run_rl(package, out_root)
    assert "the stage's code changed: verifiers/forms/asserts.py" in line, line
