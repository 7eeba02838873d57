"""The cost of an io problem of 100 cases through the warm pool: C++ (compiled once per job) vs
Python, the same problem and the same pool, in alternating rounds on this busy machine.

Each job is one sample: a program (each job's source differs, as sampled completions do) and
100 stdin cases (a line of numbers; print their sum). A C++ job compiles its program in the
sandbox, then runs the binary per case; a Python job runs the program per case. Two C++
programs: one that includes ``<bits/stdc++.h>`` first (the image holds it precompiled) and one
that includes ``<iostream>`` (no precompiled header applies). The last line is C++'s cost per
job (``<bits/stdc++.h>``) over Python's; the issue's goal is at most 2. Each row also gives
the CPU time the pool's containers used per job (read from Docker: on a machine whose cores
others keep busy, the sandbox's processes, at nice 19, wait far longer than they compute, and
CPU time is the cost that stays put), the median time of one case (its process started, fed,
run, swept) and of a compile.

    .venv/bin/python benchmarks/language_throughput.py [--jobs 8] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import docker
from machine import cpu_name

from codepost.sandbox import ExecStatus, Job, Limits, PoolConfig, SandboxPool

CASES = tuple(" ".join(str(i * k) for k in range(1, 11)) + "\n" for i in range(100))
ANSWERS = [str(sum(i * k for k in range(1, 11))) for i in range(100)]
PROGRAMS = {
    "python": "# sample {n}\nprint(sum(map(int, input().split())))\n",
    "cpp (<bits/stdc++.h>)": (
        "#include <bits/stdc++.h>\nusing namespace std;\n// sample {n}\n"
        "int main() {{ long long x, s = 0; while (cin >> x) s += x; cout << s << endl; }}\n"
    ),
    "cpp (<iostream>)": (
        "#include <iostream>\n// sample {n}\n"
        "int main() {{ long long x, s = 0; while (std::cin >> x) s += x; std::cout << s << std::endl; }}\n"
    ),
}
LANGUAGE = {"python": "python", "cpp (<bits/stdc++.h>)": "cpp", "cpp (<iostream>)": "cpp"}


def containers_cpu_s() -> float:
    """CPU seconds used so far by the containers of this process's pools."""
    label = f"codepost.owner={socket.gethostname()}:{os.getpid()}"
    containers = docker.from_env().containers.list(filters={"label": label})
    usage = (c.stats(stream=False, one_shot=True)["cpu_stats"]["cpu_usage"] for c in containers)
    return sum(u["total_usage"] for u in usage) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs (samples) per language and round")
    parser.add_argument("--workers", type=int, default=2, help="containers")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()

    limits = Limits(wall_time_s=10.0, cpu_time_s=10.0, compile_time_s=30.0)
    seconds: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    cpu: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    compile_s: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    case_s: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    load_before = os.getloadavg()
    serial = 0
    with SandboxPool(PoolConfig(size=args.workers)) as pool:
        warm = [
            Job(program=p.format(n=-1), stdin_cases=CASES[:2], language=LANGUAGE[k], limits=limits)
            for k, p in PROGRAMS.items()
        ]
        list(pool.map(warm * args.workers))
        for _ in range(args.rounds):
            for name, source in PROGRAMS.items():
                jobs = []
                for _ in range(args.jobs):
                    serial += 1
                    jobs.append(
                        Job(
                            program=source.format(n=serial),
                            stdin_cases=CASES,
                            language=LANGUAGE[name],
                            limits=limits,
                        )
                    )
                cpu_before, started = containers_cpu_s(), time.perf_counter()
                results = list(pool.map(jobs))
                seconds[name].append((time.perf_counter() - started) / len(jobs))
                cpu[name].append((containers_cpu_s() - cpu_before) / len(jobs))
                for result in results:
                    answers = [case.stdout.strip() for case in result.cases]
                    if result.status is not ExecStatus.COMPLETED or answers != ANSWERS:
                        raise SystemExit(f"{name}: a wrong result: {result}")
                    case_s[name] += [case.duration_s for case in result.cases]
                    if result.compile is not None:
                        compile_s[name].append(result.compile.duration_s)
    load_after = os.getloadavg()

    print(
        f"{cpu_name()}, {os.cpu_count()} cores; {args.workers} containers; "
        f"{args.jobs} jobs x {len(CASES)} cases per language and round, {args.rounds} rounds; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    python, python_cpu = statistics.median(seconds["python"]), statistics.median(cpu["python"])
    for name, values in seconds.items():
        per_job, per_job_cpu = statistics.median(values), statistics.median(cpu[name])
        compiled = (
            f"   compile {statistics.median(compile_s[name]):.2f} s" if compile_s[name] else ""
        )
        print(
            f"{name:24} {per_job:6.2f} s per job of {len(CASES)} cases "
            f"({len(CASES) / per_job:6.0f} cases/s)   x{per_job / python:.2f} python   "
            f"CPU {per_job_cpu:.2f} s (x{per_job_cpu / python_cpu:.2f})   "
            f"case {statistics.median(case_s[name]) * 1000:.0f} ms{compiled}"
        )
    cpp = "cpp (<bits/stdc++.h>)"
    print(f"CPU ratio: {statistics.median(cpu[cpp]) / python_cpu:.2f}")
    print(f"ratio: {statistics.median(seconds[cpp]) / python:.2f}")


if __name__ == "__main__":
    main()
