"""Verifications per second through the warm pool, per test form and language, against HumanEval's
``check`` form measured in the same run.

Each row verifies reference solutions of shipped problems (each sample's source differs by a
comment, as sampled completions do, so nothing is cached across samples) with one ``Verifier``
on one pool; the forms take turns in each round, so a machine that gets busier mid-run hurts
all of them. A row gives samples per second, tests per second (a test is an assert, a case or a
test function, as the form counts it), the wall time per sample against ``check``'s, and the CPU
time the containers used per sample (read from Docker: on a machine whose cores others keep busy
that is the cost that stays put) against ``check``'s. Every sample must pass; the problems' own
time limits (1-2 s for CodeContests) give way to the default 10 s, which a busy machine needs.

    .venv/bin/python benchmarks/form_throughput.py [--samples 8] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from language_throughput import containers_cpu_s
from machine import cpu_name

from codepost.sandbox import Limits, PoolConfig, SandboxPool
from codepost.verifiers import Problem, Verifier, load_problems
from codepost.verifiers.problems import posed_in


@dataclass(frozen=True)
class Row:
    name: str
    source: str
    keep: Callable[[Problem], bool] = lambda problem: True
    language: str | None = None  # the set posed in this language (None: each problem's own)


ROWS = [
    Row("check (HumanEval)", "humaneval", lambda p: int(p.task_id.split("/")[1]) < 8),
    Row("asserts (MBPP)", "mbpp", lambda p: int(p.task_id) < 19),
    Row("io, Python (CodeContests)", "codecontests-sample"),
    Row("io, C++ (CodeContests)", "codecontests-sample", language="cpp"),
    Row("io, checker programs (cpp-sample)", "cpp-sample"),
    Row("call (TACO)", "taco-sample", lambda p: p.test_form == "call"),
    Row("pytest (KodCode)", "kodcode-sample"),
]


def samples_for(problems: dict[str, Problem], count: int, serial: int) -> list[dict]:
    """``count`` reference samples, the row's problems in turn, each marked by a comment."""
    samples = []
    for n, (task_id, problem) in zip(range(count), itertools.cycle(problems.items())):
        marker = "//" if problem.language == "cpp" else "#"
        code = f"{problem.canonical_solution}\n{marker} sample {serial + n}\n"
        samples.append({"task_id": task_id, "completion": code})
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="samples per form and round")
    parser.add_argument("--workers", type=int, default=2, help="containers")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the forms in turn")
    args = parser.parse_args()

    problem_sets = {}
    for row in ROWS:
        problems = posed_in(load_problems(row.source), row.language)
        problem_sets[row.name] = {  # the default limits: a busy machine misses 1 s ones
            t: p.model_copy(update={"time_limit_s": None})
            for t, p in problems.items()
            if row.keep(p)
        }
    seconds: dict[str, list[float]] = {row.name: [] for row in ROWS}
    cpu: dict[str, list[float]] = {row.name: [] for row in ROWS}
    tests: dict[str, list[float]] = {row.name: [] for row in ROWS}
    load_before = os.getloadavg()
    serial = 0
    limits = Limits(compile_time_s=30.0)  # a compile on a busy 2-core machine
    with SandboxPool(PoolConfig(size=args.workers)) as pool:
        verifier = Verifier(pool, limits=limits, completion_style="continuation")
        for row in ROWS:  # warm up: each form's first jobs, the image's caches
            problems = problem_sets[row.name]
            verifier.verify(problems, samples_for(problems, len(problems), -1000))
        for _ in range(args.rounds):
            for row in ROWS:
                problems = problem_sets[row.name]
                samples = samples_for(problems, args.samples, serial)
                serial += len(samples)
                cpu_before, started = containers_cpu_s(), time.perf_counter()
                verdicts = verifier.verify(problems, samples)
                seconds[row.name].append((time.perf_counter() - started) / len(samples))
                cpu[row.name].append((containers_cpu_s() - cpu_before) / len(samples))
                failed = [v.result for v in verdicts if not v.passed]
                if failed:
                    raise SystemExit(f"{row.name}: a reference failed: {failed[:3]}")
                tests[row.name].append(sum(len(v.tests) for v in verdicts) / len(samples))
    load_after = os.getloadavg()

    print(
        f"{cpu_name()}, {os.cpu_count()} cores; {args.workers} containers; "
        f"{args.samples} samples per form and round, {args.rounds} rounds; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    base = ROWS[0].name
    base_s, base_cpu = statistics.median(seconds[base]), statistics.median(cpu[base])
    for row in ROWS:
        per_sample, per_sample_cpu = (
            statistics.median(seconds[row.name]),
            statistics.median(cpu[row.name]),
        )
        per_test = statistics.median(tests[row.name])
        print(
            f"{row.name:36} {1 / per_sample:6.2f} samples/s {per_test / per_sample:7.1f} tests/s "
            f"({per_test:5.1f} tests per sample)   x{per_sample / base_s:.2f} check   "
            f"CPU {per_sample_cpu:.2f} s per sample (x{per_sample_cpu / base_cpu:.2f})"
        )


if __name__ == "__main__":
    main()
