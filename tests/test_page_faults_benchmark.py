"""``benchmarks/page_faults.py`` counts what it says: a forked child that writes to more of its
parent's pages takes a copy-on-write fault for each, and spends CPU on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "page_faults.py"


def test_each_page_a_child_writes_is_one_more_fault():
    # In a small process of its own, as the script runs: forked from this one (torch, vLLM),
    # a child's fork and exit alone cost over 100 ms, and its faults' cost is lost in that.
    done = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), "--json"], capture_output=True, text=True, check=True
    )
    results = {
        int(pages): (cpu, faults) for pages, (cpu, faults) in json.loads(done.stdout).items()
    }
    most = max(results)
    assert most * 0.95 <= results[most][1] - results[0][1] <= most * 1.1
    assert results[most][0] > results[0][0]
