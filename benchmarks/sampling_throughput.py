"""Completion tokens per second: our samplers vs plain transformers ``generate``, same work.

Same model (the embedded SmolLM2-135M-Instruct by default), same chat prompts (HumanEval),
same settings (G samples per prompt, temperature, max tokens), one run on this machine:

* ``hf sampler``: our transformers sampler, rows with their sampling logprobs (``generate``,
  then a scoring forward over prompt + completion);
* ``plain generate``: the ``generate`` calls inside that same run, timed on their own: the
  same tokens with no logprobs, the fair baseline;
* ``vLLM N threads``: our vLLM sampler with ``engine.cpu_threads=N``, for each ``--threads``
  (``--no-vllm`` skips them), on the ``chat-free`` prompts (the assistant's turn left open,
  no stop at the fence) as the other rows. Engine start-up is reported apart: a run pays it
  once, not per iteration;
* ``vLLM stop rule``: the engine at its default threads (every core but one) on ``chat``
  prompts (the answer opens with the code fence and stops at its closing fence).

``useful`` tokens are those through the closing fence of a completion's first code block (all
of them where no block closes): what the verifier reads. The HF sampler's peak memory is the
rise of this process's peak RSS (``VmHWM``) over the call. The last line is
``ratio: vLLM tokens/s / plain generate tokens/s`` (vLLM at its default threads; the
default is among ``--threads``).

    .venv/bin/python benchmarks/sampling_throughput.py [--prompts 32] [--samples 4] \\
        [--max-tokens 128] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from machine import describe

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import build_prompt
from codepost.pipeline.inference.engines import close_samplers, get_sampler
from codepost.pipeline.inference.sampling import (
    EngineConfig,
    HFSampler,
    SamplingConfig,
    reserved_cores,
)
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.verifiers.extraction import fence


def timed_sampling(sampler, prompts, config: SamplingConfig) -> tuple[float, int]:
    seconds, rows = timed_rows(sampler, prompts, config)
    return seconds, sum(len(r["completion_ids"]) for r in rows)


def timed_rows(sampler, prompts, config: SamplingConfig) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    rows = sampler.sample(prompts, config)
    return time.perf_counter() - started, rows


def useful_tokens(row: dict[str, Any], tokenizer: Any) -> int:
    """The completion's tokens through the closing fence of its first code block (re-tokenized
    text), or all of them where no block closes."""
    lines = row["completion"].splitlines(keepends=True)
    opened = next((i for i, line in enumerate(lines) if fence(line)), None)
    closing = next(
        (i for i in range(len(lines)) if opened is not None and i > opened and fence(lines[i])),
        None,
    )
    if closing is None:
        return len(row["completion_ids"])
    text = "".join(lines[:closing]) + lines[closing].rstrip("\n")
    return min(len(row["completion_ids"]), len(tokenizer.encode(text, add_special_tokens=False)))


def peak_rss_rise_mib(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()`` and how far this process's peak RSS rose above its RSS before it (Linux)."""
    status = Path("/proc/self/status")

    def kib(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+) kB", status.read_text()).group(1))

    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = kib("VmRSS")
    result = call()
    return result, (kib("VmHWM") - before) / 1024


class GenerateTimer:
    """Wraps ``model.generate``: the seconds spent inside it."""

    def __init__(self, model: Any) -> None:
        self.seconds = 0.0
        self.generate = model.generate
        model.generate = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


def rate(name: str, tokens: int, seconds: float) -> float:
    print(f"{name:16s} {tokens:6d} tokens in {seconds:6.1f} s = {tokens / seconds:7.1f} tok/s")
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=ModelConfig().name_or_path)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM sampler")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, len(os.sched_getaffinity(0))],
        help="vLLM engine.cpu_threads to compare (the default, every core but one, always runs)",
    )
    args = parser.parse_args()

    model = ModelConfig(name_or_path=args.model)
    checkpoint = model.resolve()
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(ProblemSet(limit=args.prompts))
    prompts = [build_prompt(p, tokenizer) for p in problems.values()]  # stop at the fence
    free = [build_prompt(p, tokenizer, "chat-free") for p in problems.values()]
    config = SamplingConfig(
        num_generations=args.samples, max_tokens=args.max_tokens, temperature=args.temperature
    )
    warm_up = config.model_copy(update={"max_tokens": 8})
    print(describe())
    print(
        f"{args.model}: {len(prompts)} prompts x {args.samples} samples x <= {args.max_tokens} "
        f"tokens, temperature {args.temperature}"
    )

    # First, before vLLM's engine process exists: the peak RSS is the HF sampler's alone.
    engine = EngineConfig(backend="hf")
    hf = HFSampler(checkpoint, model, engine)
    timed_sampling(hf, free[:2], warm_up)
    generate = GenerateTimer(hf.model)
    (hf_s, hf_tokens), hf_rise = peak_rss_rise_mib(partial(timed_sampling, hf, free, config))
    hf_rate = rate("hf sampler", hf_tokens, hf_s)
    generate_rate = rate("plain generate", hf_tokens, generate.seconds)
    print(
        f"hf sampler: peak RSS +{hf_rise:.0f} MiB over the call "
        f"({engine.hf_max_sequences} sequences per generate, {engine.hf_logprob_tokens} "
        f"tokens per scoring forward); hf sampler / plain generate: {hf_rate / generate_rate:.2f}"
    )
    del hf
    if args.no_vllm:
        return

    cores = len(os.sched_getaffinity(0))
    default_threads = cores - reserved_cores(None)
    rates = {}
    for threads in sorted({*args.threads, default_threads}):
        started = time.perf_counter()
        vllm = get_sampler(model, EngineConfig(cpu_threads=threads))
        print(f"vLLM engine start: {time.perf_counter() - started:.1f} s (once per run)")
        timed_sampling(vllm, free[:2], warm_up)
        seconds, rows = timed_rows(vllm, free, config)
        tokens = sum(len(r["completion_ids"]) for r in rows)
        rates[threads] = rate(f"vLLM {threads} threads", tokens, seconds)
        useful = sum(useful_tokens(r, tokenizer) for r in rows)
        rate("  useful", useful, seconds)
        if threads == default_threads:
            stop_s, stop_rows = timed_rows(vllm, prompts, config)
            stop_tokens = sum(len(r["completion_ids"]) for r in stop_rows)
            stop_rate = rate("vLLM stop rule", stop_tokens, stop_s)
            stop_useful = rate(
                "  useful", sum(useful_tokens(r, tokenizer) for r in stop_rows), stop_s
            )
            print(
                f"stop rule: {stop_tokens / len(stop_rows):.0f} tokens per completion against "
                f"{tokens / len(rows):.0f}; useful tok/s x{stop_useful * seconds / useful:.2f}"
            )
        close_samplers()
    vllm_rate = rates[default_threads]
    for threads, other in rates.items():
        if threads != default_threads:
            print(f"vLLM {threads} / {default_threads} threads: {other / vllm_rate:.2f}")
    print(f"vLLM / hf sampler: {vllm_rate / hf_rate:.2f}")
    print(f"stop rule / plain generate: {stop_rate / generate_rate:.2f}")
    print(f"ratio: {vllm_rate / generate_rate:.2f}")


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    main()
