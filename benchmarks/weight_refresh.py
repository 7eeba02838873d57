"""Serving new weights: an in-place refresh of the running vLLM engine vs starting a new one.

The same new checkpoint (the model with its weights perturbed, as after an update) is served
both ways, in one run on this machine; both are checked with the probe: the engine's logprobs
of a fixed sequence against the trainer's (transformers, float32) for those weights. The last
line is ``ratio: new engine seconds / refresh seconds``.

    .venv/bin/python benchmarks/weight_refresh.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import describe

from codepost.pipeline.inference.sampling import (
    EngineConfig,
    VLLMSampler,
    check_probe,
    trainer_probe_logprobs,
)
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer


def perturbed_checkpoint(model: ModelConfig, folder: Path, seed: int) -> tuple[Path, list[float]]:
    """A new checkpoint (weights + small noise) and the trainer's probe logprobs for it."""
    policy = load_causal_lm(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    path = folder / f"checkpoint-{seed}"
    policy.save_pretrained(path)
    load_tokenizer(model).save_pretrained(path)
    return path, trainer_probe_logprobs(policy, policy.config.vocab_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=ModelConfig().name_or_path)
    parser.add_argument("--repeats", type=int, default=3, help="refreshes timed (median)")
    args = parser.parse_args()

    model = ModelConfig(name_or_path=args.model)
    engine = EngineConfig()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = [perturbed_checkpoint(model, Path(tmp), seed) for seed in range(args.repeats)]
        sampler = VLLMSampler(model.resolve(), model, engine)
        refresh_s, diffs = [], []
        for path, expected in checkpoints:
            started = time.perf_counter()
            diffs.append(sampler.refresh(path, expected))  # raises if it did not take
            refresh_s.append(time.perf_counter() - started)
        stale = check_probe(sampler.probe_logprobs(), checkpoints[-1][1], engine.probe_tolerance)
        sampler.llm.llm_engine.engine_core.shutdown()
        del sampler

        path, expected = checkpoints[-1]
        started = time.perf_counter()
        fresh = VLLMSampler(str(path), model, engine)
        fresh_diff = check_probe(fresh.probe_logprobs(), expected, engine.probe_tolerance)
        new_engine_s = time.perf_counter() - started
        fresh.llm.llm_engine.engine_core.shutdown()

    refresh = statistics.median(refresh_s)
    print(describe())
    print(
        f"in-place refresh (load + layerwise reload + probe check): median {refresh:.2f} s "
        f"of {[round(s, 2) for s in refresh_s]}; probe |diff| {max(diffs):.2e} (last: {stale:.2e})"
    )
    print(
        f"new engine on the same checkpoint (start + probe): {new_engine_s:.1f} s; probe |diff| {fresh_diff:.2e}"
    )
    print(f"ratio: {new_engine_s / refresh:.1f}")


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    main()
