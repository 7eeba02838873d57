"""The resume key sees the code a stage runs: every module of the package the stage's module
imports, directly or through others. Edit a loss, and RL computes again, naming the file; edit
another stage, and RL is reused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codepost.pipeline.code_version import ROOT
from codepost.pipeline.stages import get_stage

# The package's folders, as a copy of the package needs them (MBPP's data included).
PACKAGE_PARTS = ("__init__.py", "sandbox", "verifiers", "pipeline", "flows")

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


@pytest.mark.slow
def test_an_edited_loss_recomputes_rl_and_the_log_names_the_file(tmp_path):
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
