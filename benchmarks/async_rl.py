"""The asynchronous RL loop against the synchronous one on this machine: wall time per
iteration, samples per second, and the pass rate per sample over the same number of samples
(what staleness costs the learning), for ``max_staleness`` 1 and 2.

Each run is a process of its own in a fresh folder, from the same model, seed and prompts
(dynamic sampling off, so that every iteration samples ``prompts x samples``), with the
transformers engine and the Docker sandbox. The asynchronous loop runs with the trainer
pinned to the first core and the sampler's process to the second, one thread each; the
synchronous loop on both cores with ``--sync-threads`` threads (1 by default: on a machine
other work shares, two threads that wait for each other at every matmul lose most of their
time to it, and the comparison would measure that instead of the overlap; 2 on an idle one).
Wall time per iteration is the steady state, from iteration 1's checkpoint to the last one's:
neither the engine's nor the sandbox pool's start counts. The pass rate is over every sample
a run scored, with a Wilson 95% interval; at the sizes a 2-core machine allows it says how
noisy the comparison is more than what staleness costs.

    .venv/bin/python benchmarks/async_rl.py [--iterations 6] [--prompts 2] [--samples 4]

For the learning cost, start from a checkpoint that passes some of its problems and sample
those (``--model``, ``--source``: e.g. an SFT stage's folder and the ``problems.jsonl`` of the
difficulty filter after it). The runs' folders hold every checkpoint whole (their publishing
times are read) and are deleted at the end unless ``--keep`` names a folder for them.

The last line is ``ratio: K=1 wall time per iteration / synchronous``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from machine import describe

from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.model_config import DEFAULT_MODEL, ModelConfig
from codepost.pipeline.reporting.stats import wilson_interval
from codepost.pipeline.rl.asynchronous import AsyncConfig
from codepost.pipeline.rl.update_config import UpdateConfig
from codepost.pipeline.stages.rl import METRICS_FILE, RLConfig, iteration_dir, run_rl

MODES = {"sync": None, "K=1": 1, "K=2": 2}
TRAINER_CORE, SAMPLER_CORE = 0, 1


@dataclass(frozen=True)
class Result:
    mode: str
    seconds_per_iteration: float  # steady state
    samples_per_second: float
    passed: int
    samples: int
    staleness_mean: float  # of the trained rows, in policy versions
    rows_stale: int
    trainer_idle_s: float  # per iteration
    sampler_idle_s: float

    def row(self, baseline: Result) -> list[str]:
        low, high = wilson_interval(self.passed, self.samples)
        speed_up = baseline.seconds_per_iteration / self.seconds_per_iteration
        throughput = self.samples_per_second / baseline.samples_per_second
        pass_rate = self.passed / self.samples
        return [
            self.mode,
            f"{self.seconds_per_iteration:.1f} ({speed_up:.2f}x)",
            f"{self.samples_per_second:.3f} ({throughput:.2f}x)",
            f"{self.passed}/{self.samples} = {pass_rate:.3f} [{low:.3f}, {high:.3f}]",
            f"{self.staleness_mean:.2f}",
            str(self.rows_stale),
            f"{self.trainer_idle_s:.1f}",
            f"{self.sampler_idle_s:.1f}",
        ]


def config(args: argparse.Namespace, max_staleness: int | None) -> RLConfig:
    asynchronous = None
    if max_staleness is not None:
        asynchronous = AsyncConfig(max_staleness=max_staleness, sampler_cpus=[SAMPLER_CORE])
    return RLConfig(
        model=ModelConfig(name_or_path=args.model),
        problems=ProblemSet(source=args.source, split=args.split, limit=args.problems),
        iterations=args.iterations,
        prompts_per_iteration=args.prompts,
        dynamic_sampling=False,
        sampling=SamplingConfig(num_generations=args.samples, max_tokens=args.max_tokens),
        engine=EngineConfig(backend="hf"),
        update=UpdateConfig(learning_rate=args.learning_rate, sampler_is_cap=2.0),
        asynchronous=asynchronous,
        save_total_limit=None,  # every checkpoint's time of publishing is read
    )


def run(args: argparse.Namespace) -> None:
    """One run, in this process: the asynchronous trainer on its core, one thread."""
    import torch

    max_staleness = MODES[args.run]
    if max_staleness is None:
        torch.set_num_threads(args.sync_threads)
    else:
        os.sched_setaffinity(0, {TRAINER_CORE})
        torch.set_num_threads(1)
    run_rl(config(args, max_staleness), Path(args.out))


def result(mode: str, out: Path, iterations: int) -> Result:
    from codepost.pipeline.data.rows import read_table

    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    published = [
        (iteration_dir(out, i) / "manifest.json").stat().st_mtime for i in range(1, iterations + 1)
    ]
    span = published[-1] - published[0]
    by_iteration = {
        int(path.stem.removeprefix("iteration-")): read_table(path, ("passed",)).to_pylist()
        for path in (out / "rollouts").glob("iteration-*.parquet")
    }
    scored = [row for written in by_iteration.values() for row in written]
    staleness = [
        i - 1 - row["policy_version"]
        for i, written in by_iteration.items()
        for row in written
        if row["trained"]
    ]
    steady = rows[1:]
    return Result(
        mode=mode,
        seconds_per_iteration=span / (iterations - 1),
        samples_per_second=sum(r["data/samples"] for r in steady) / span,
        passed=sum(bool(row["passed"]) for row in scored),
        samples=len(scored),
        staleness_mean=sum(staleness) / len(staleness) if staleness else float("nan"),
        rows_stale=int(sum(r.get("queue/rows_stale", 0) for r in rows)),
        trainer_idle_s=sum(r.get("time/trainer_idle_s", 0.0) for r in steady) / len(steady),
        sampler_idle_s=sum(r.get("time/sampler_idle_s", 0.0) for r in steady) / len(steady),
    )


def table(results: list[Result]) -> str:
    header = [
        "loop",
        "s / iteration (speed-up)",
        "samples / s (ratio)",
        "pass rate per sample [95%]",
        "staleness",
        "rows stale",
        "trainer idle s/it",
        "sampler idle s/it",
    ]
    lines = [header, ["---"] * len(header)] + [r.row(results[0]) for r in results]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per iteration")
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the policy to start from")
    parser.add_argument("--source", default="mbpp", help="the problems (a ProblemSet source)")
    parser.add_argument("--split", default="train", help="the source's split")
    parser.add_argument("--problems", type=int, default=64, help="how many of them, at most")
    parser.add_argument("--learning-rate", type=float, default=2e-6)
    parser.add_argument("--sync-threads", type=int, default=1, help="the synchronous run's")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here")
    parser.add_argument("--run", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        return run(args)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores: the trainer on one, the sampler's process on another")
    root = args.keep or Path(tempfile.mkdtemp(prefix="async-rl-"))
    try:
        compare(args, root)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)  # gigabytes of checkpoints a run


def compare(args: argparse.Namespace, root: Path) -> None:
    """Each mode's run in a process of its own, in ``root``; the table and the ratio."""
    print(describe())
    print(
        f"{args.iterations} iterations of {args.prompts} prompts x {args.samples} samples "
        f"(at most {args.max_tokens} tokens), transformers engine; synchronous on every core "
        f"with {args.sync_threads} thread(s), asynchronous with the trainer on core "
        f"{TRAINER_CORE} and the sampler on core {SAMPLER_CORE}, one thread each"
    )
    results = []
    for mode in args.modes:
        out = root / mode.replace("=", "")
        forwarded = [*sys.argv[1:], "--run", mode, "--out", str(out)]
        subprocess.run([sys.executable, __file__, *forwarded], check=True)
        results.append(result(mode, out, args.iterations))
        print(f"{mode}: done", flush=True)
    print(table(results))
    by_mode = {r.mode: r for r in results}
    if "sync" in by_mode and "K=1" in by_mode:
        ratio = by_mode["K=1"].seconds_per_iteration / by_mode["sync"].seconds_per_iteration
        print(f"ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
