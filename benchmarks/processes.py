"""The same run on 1 and on N processes: ``codepost run --launch.num-processes`` wall time, and what
each run gave (greedy pass@1 per stage, every stage's record), in one run on this machine.

The rank-aware stages (sft, rl, dpo) run under ``accelerate launch`` on N ranks, the others in
the driver. On a 2-core CPU this shows that N processes work and give the same kind of result,
not a speed-up. The last line is ``ratio: N-process seconds / 1-process seconds``.

    .venv/bin/python benchmarks/processes.py --config configs/ranks-check.yaml [--processes 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

from codepost.pipeline.reporting.evaluations import RESULTS_FILE, EvaluationResults


def timed_run(config: Path, run_dir: Path, processes: int, log: Path) -> float:
    """``codepost run`` of ``config`` into ``run_dir`` on ``processes`` processes: seconds."""
    command = [
        sys.executable, "-m", "codepost.flows.cli", "run", f"--config={config}",
        f"--run-dir={run_dir}", f"--launch.num-processes={processes}",
    ]  # fmt: skip
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{processes} process(es): exit {done.returncode}; see {log}")
    return seconds


def pass_at_1(run_dir: Path) -> dict[str, str]:
    """Greedy pass@1 per evaluated stage, as ``passed/problems``, from the run's evaluations."""
    results = {}
    for path in sorted(run_dir.glob(f"*/eval/*/*/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime):
        greedy = EvaluationResults.model_validate_json(path.read_text()).greedy
        if greedy is not None:
            stage, benchmark = path.parts[-5], path.parts[-3]
            results[f"{stage} {benchmark}"] = f"{greedy.passed}/{greedy.samples}"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="a PostTrainConfig YAML")
    parser.add_argument("--processes", type=int, default=2, help="N, against 1")
    parser.add_argument("--keep", type=Path, help="keep the run folders and logs here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        seconds, results = {}, {}
        for processes in (1, args.processes):
            run_dir = root / f"{processes}-processes"
            seconds[processes] = timed_run(
                args.config, run_dir, processes, root / f"{processes}-processes.log"
            )
            results[processes] = pass_at_1(run_dir)
            print(f"{processes} process(es): {seconds[processes]:.0f} s", flush=True)
    print(f"CPU: {cpu_name()}")
    print(f"{'stage':<24}" + "".join(f"{f'{n} process(es)':>16}" for n in seconds))
    for stage in results[1]:
        print(f"{stage:<24}" + "".join(f"{results[n].get(stage, '-'):>16}" for n in seconds))
    print(f"ratio: {seconds[args.processes] / seconds[1]:.2f}")


if __name__ == "__main__":
    main()
