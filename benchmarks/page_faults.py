"""What a copy-on-write page fault costs on this machine: the price of every page a forked
process writes, which is most of what a sandbox job costs (``verify_profile.py`` counts them).

A parent fills a buffer; forked children each write one byte into ``pages`` of its pages and
exit, and the parent reads each child's CPU time and fault count from ``wait4``. The slope of
CPU over pages is the cost of one fault; the intercept, a fork and an exit. Measured here and
in a container of the sandbox image (its Python, the pool's one-CPU quota), in the same run.

    .venv/bin/python benchmarks/page_faults.py [--image codepost-sandbox:latest]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PAGE = 4096
PAGES = (0, 250, 500, 1000)


def measure(forks: int = 100) -> dict[int, tuple[float, float]]:
    """``pages`` -> (the median child's CPU in ms, its page faults)."""
    buffer = bytearray(b"\1" * (max(PAGES) * PAGE))
    results = {}
    for pages in PAGES:
        cpu, faults = [], []
        for _ in range(forks):
            pid = os.fork()
            if pid == 0:
                for page in range(pages):
                    buffer[page * PAGE] = 2
                os._exit(0)
            _, _, usage = os.wait4(pid, 0)
            cpu.append((usage.ru_utime + usage.ru_stime) * 1e3)
            faults.append(usage.ru_minflt)
        results[pages] = (sorted(cpu)[forks // 2], sorted(faults)[forks // 2])
    return results


def report(where: str, results: dict[int, tuple[float, float]]) -> None:
    (none, base_faults), (most, most_faults) = results[0], results[max(PAGES)]
    per_fault = (most - none) / (most_faults - base_faults) * 1e3
    print(f"{where}: {per_fault:.1f} us per copy-on-write fault; a fork and exit {none:.2f} ms")
    for pages, (cpu, faults) in results.items():
        print(f"    {pages:5} pages written: {cpu:6.2f} ms of CPU, {faults:5.0f} faults")


def main() -> None:
    if sys.argv[1:] == ["--json"]:  # the measurement alone, as the container runs it
        print(json.dumps(measure()))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="codepost-sandbox:latest")
    args = parser.parse_args()
    from machine import describe

    print(describe())
    report("this machine", measure())
    script = Path(__file__).read_text()
    command = ["docker", "run", "--rm", "-i", "--network", "none", "--cpus", "1"]
    command += ["--entrypoint", "python3", args.image, "-I", "-", "--json"]
    try:
        done = subprocess.run(command, input=script, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"in {args.image}: not measured ({exc})")
        return
    report(f"in {args.image}", {int(k): tuple(v) for k, v in json.loads(done.stdout).items()})


if __name__ == "__main__":
    main()
