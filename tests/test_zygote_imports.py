"""What the sandbox's zygotes hold: every module they import is memory whose page tables each
fork copies and each exit tears down, for every process of every job (docs/verifier-service.md,
round three: 8.2 -> 5.8 MB of a zygote's memory took a tenth of a HumanEval job's CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import codepost.sandbox

RUNNER_PARENT = Path(codepost.sandbox.__file__).parent

# Modules no process a zygote forks needs at start: each pulls in others (inspect: ast, dis,
# tokenize; dataclasses: inspect). A program or a test that wants one imports it itself.
HEAVY = {"inspect", "dataclasses", "hashlib", "pathlib", "pkgutil", "ast", "subprocess"}


def test_the_zygotes_import_none_of_the_heavy_modules():
    # As the container starts them: a fresh interpreter, -I -S, the runner package on the path.
    code = (
        f"import sys; sys.path.insert(0, {str(RUNNER_PARENT)!r})\n"
        "import runner.zygote, runner.judge\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    )
    imported = set(done.stdout.split())
    assert {"runner.zygote", "runner.judge", "json", "typing"} <= imported  # it did import them
    assert imported & HEAVY == set()
