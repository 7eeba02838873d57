"""Greedy tokens per second of the vLLM engine on the CPU at each worker thread count, the way
an evaluation samples (HumanEval chat prompts, one completion each, at most 256 tokens).

Each setting runs in a process of its own: vLLM binds its threads once per engine, and
``LD_PRELOAD`` (``--preload``, e.g. tcmalloc or Intel OpenMP) is read when a process starts.
The first setting is the baseline; the last lines are each setting's ratio to it, measured in
the same run. The CPU is named.

    .venv/bin/python benchmarks/engine_threads.py [--prompts 48] [--threads 1 2] \\
        [--preload /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from machine import cpu_name


def measure(prompts: int, threads: int) -> dict[str, float]:
    from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
    from codepost.pipeline.data.prompts import build_prompt
    from codepost.pipeline.inference.engines import close_samplers, get_sampler
    from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
    from codepost.pipeline.model_config import ModelConfig, load_tokenizer

    model = ModelConfig()
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(ProblemSet(limit=prompts)).values()
    chat = [build_prompt(p, tokenizer) for p in problems]
    started = time.perf_counter()
    sampler = get_sampler(model, EngineConfig(cpu_threads=threads))
    start_s = time.perf_counter() - started
    greedy = SamplingConfig(num_generations=1, temperature=0.0, max_tokens=256)
    sampler.sample(chat[:2], greedy.model_copy(update={"max_tokens": 8}))  # warm-up
    started = time.perf_counter()
    rows = sampler.sample(chat, greedy)
    seconds = time.perf_counter() - started
    close_samplers()
    tokens = sum(len(r["completion_ids"]) for r in rows)
    return {"start_s": start_s, "seconds": seconds, "tokens": tokens, "rate": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--preload", action="append", default=[], help="also with LD_PRELOAD=")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a setting's own process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.prompts, args.one)))
        return

    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; "
          f"{args.prompts} HumanEval chat prompts, greedy, <= 256 tokens")  # fmt: skip
    results: list[tuple[str, float]] = []
    for preload in ["", *args.preload]:
        for threads in args.threads:
            env = {**os.environ, "LD_PRELOAD": preload} if preload else dict(os.environ)
            argv = [sys.executable, __file__, "--prompts", str(args.prompts), "--one", str(threads)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            name = f"{threads} thread{'s' * (threads > 1)}" + (f", {preload}" if preload else "")
            print(f"{name}: {result['rate']:.1f} tokens/s ({result['tokens']} tokens in "
                  f"{result['seconds']:.1f} s; engine start {result['start_s']:.1f} s)")  # fmt: skip
            results.append((name, result["rate"]))
    (baseline, base_rate), *others = results
    for name, rate in others:
        print(f"ratio {name} / {baseline}: {rate / base_rate:.2f}")


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    main()
