"""``benchmarks/page_faults.py`` counts what it says: a forked child that writes to more of its
parent's pages takes a copy-on-write fault for each."""

from __future__ import annotations

from benchmark_scripts import load


def test_each_page_a_child_writes_is_one_more_fault():
    page_faults = load("page_faults")
    results = page_faults.measure(forks=5)
    faults = {pages: fault_count for pages, (_, fault_count) in results.items()}
    most = max(page_faults.PAGES)
    assert most * 0.95 <= faults[most] - faults[0] <= most * 1.1
    assert results[most][0] > results[0][0]  # and each costs CPU
