"""Completion tokens per second: our samplers vs plain transformers ``generate``, same work.

Same model (the embedded SmolLM2-135M-Instruct by default), same chat prompts (HumanEval),
same settings (G samples per prompt, temperature, max tokens), one run on this machine:

* ``hf sampler``: our transformers sampler, rows with their sampling logprobs (``generate``,
  then a scoring forward over prompt + completion);
* ``plain generate``: the ``generate`` calls inside that same run, timed on their own: the
  same tokens with no logprobs, the fair baseline;
* ``vLLM sampler``: our vLLM sampler (``--no-vllm`` skips it). Engine start-up is reported
  apart: a run pays it once, not per iteration.

The HF sampler's peak memory is the rise of this process's peak RSS (``VmHWM``) over the call.
The last line is ``ratio: vLLM tokens/s / plain generate tokens/s``.

    .venv/bin/python benchmarks/sampling_throughput.py [--prompts 32] [--samples 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import build_prompt
from codepost.pipeline.inference.sampling import (
    EngineConfig,
    HFSampler,
    SamplingConfig,
    VLLMSampler,
)
from codepost.pipeline.model_config import ModelConfig, load_tokenizer


def timed_sampling(sampler, prompts, config: SamplingConfig) -> tuple[float, int]:
    started = time.perf_counter()
    rows = sampler.sample(prompts, config)
    return time.perf_counter() - started, sum(len(r["completion_ids"]) for r in rows)


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
    args = parser.parse_args()

    model = ModelConfig(name_or_path=args.model)
    checkpoint = model.resolve()
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(ProblemSet(limit=args.prompts))
    prompts = [build_prompt(p, tokenizer) for p in problems.values()]
    config = SamplingConfig(
        num_generations=args.samples, max_tokens=args.max_tokens, temperature=args.temperature
    )
    warm_up = config.model_copy(update={"max_tokens": 8})
    print(
        f"{args.model}: {len(prompts)} prompts x {args.samples} samples x <= {args.max_tokens} "
        f"tokens, temperature {args.temperature}"
    )

    # First, before vLLM's engine process exists: the peak RSS is the HF sampler's alone.
    engine = EngineConfig(backend="hf")
    hf = HFSampler(checkpoint, model, engine)
    timed_sampling(hf, prompts[:2], warm_up)
    generate = GenerateTimer(hf.model)
    (hf_s, hf_tokens), hf_rise = peak_rss_rise_mib(partial(timed_sampling, hf, prompts, config))
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

    started = time.perf_counter()
    vllm = VLLMSampler(checkpoint, model, EngineConfig())
    print(f"vLLM engine start: {time.perf_counter() - started:.1f} s (once per run)")
    timed_sampling(vllm, prompts[:2], warm_up)
    vllm_s, vllm_tokens = timed_sampling(vllm, prompts, config)
    vllm.llm.llm_engine.engine_core.shutdown()
    vllm_rate = rate("vLLM sampler", vllm_tokens, vllm_s)
    print(f"vLLM / hf sampler: {vllm_rate / hf_rate:.2f}")
    print(f"ratio: {vllm_rate / generate_rate:.2f}")


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    main()
