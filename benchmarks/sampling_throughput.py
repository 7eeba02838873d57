"""Completion tokens per second: our vLLM sampler vs transformers ``generate``, same work.

Same model (the embedded SmolLM2-135M-Instruct by default), same chat prompts (HumanEval),
same settings (G samples per prompt, temperature, max tokens), one run on this machine. Engine
start-up is reported apart: a run pays it once, not per iteration. The last line is
``ratio: vLLM tokens/s / generate tokens/s``.

    .venv/bin/python benchmarks/sampling_throughput.py [--prompts 32] [--samples 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=ModelConfig().name_or_path)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    model = ModelConfig(name_or_path=args.model)
    checkpoint = model.resolve()
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(ProblemSet(limit=args.prompts))
    prompts = [build_prompt(p, tokenizer) for p in problems.values()]
    config = SamplingConfig(
        num_generations=args.samples, max_tokens=args.max_tokens, temperature=args.temperature
    )
    print(
        f"{args.model}: {len(prompts)} prompts x {args.samples} samples x <= {args.max_tokens} "
        f"tokens, temperature {args.temperature}"
    )

    started = time.perf_counter()
    vllm = VLLMSampler(checkpoint, model, EngineConfig())
    print(f"vLLM engine start: {time.perf_counter() - started:.1f} s (once per run)")
    timed_sampling(vllm, prompts[:2], config.model_copy(update={"max_tokens": 8}))  # warm-up
    vllm_s, vllm_tokens = timed_sampling(vllm, prompts, config)
    vllm.llm.llm_engine.engine_core.shutdown()
    del vllm

    hf = HFSampler(checkpoint, model, EngineConfig(backend="hf"))
    timed_sampling(hf, prompts[:2], config.model_copy(update={"max_tokens": 8}))  # warm-up
    hf_s, hf_tokens = timed_sampling(hf, prompts, config)

    vllm_rate, hf_rate = vllm_tokens / vllm_s, hf_tokens / hf_s
    print(
        f"vLLM sampler:           {vllm_tokens:6d} tokens in {vllm_s:6.1f} s = {vllm_rate:7.1f} tok/s"
    )
    print(f"transformers generate:  {hf_tokens:6d} tokens in {hf_s:6.1f} s = {hf_rate:7.1f} tok/s")
    print(f"ratio: {vllm_rate / hf_rate:.2f}")


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    main()
