"""Tokens per second of our GRPO update vs TRL 1.16 ``GRPOTrainer``'s training step, the time
the update spends on zero-advantage groups, and its model FLOP utilisation (MFU).

Same model weights, same scored batch, same settings (DAPO-style token-mean loss, clip 0.2,
beta 0, AdamW, grad clip 1.0, fp32, micro-batches of ``--micro-batch-size``, one optimizer step
per batch). TRL's step is its own ``training_step`` (compute_loss + backward) over the
micro-batches, then clip, optimizer step and zero_grad, with generation switched off: the
inputs are the dicts its ``_generate_and_score_completions`` would have produced. Each TRL
micro-batch is trimmed to its own longest row (TRL pads all of them to the generation batch's
longest: the trim only helps TRL). Ours is ``PolicyUpdater.update`` on the rollout batch,
batch shaping and advantage computation included.

Zero-advantage groups: ``--uniform-fraction`` of the groups (default 0.5) all fail with equal
reward, as many do in real runs. "Before" is our update with ``drop_uniform_groups=False``
(forward and backward on every row, the uniform ones adding zero gradient; this is also the
run compared with TRL, which trains on every row); "after" is ``drop_uniform_groups=True``
(the default), which removes them before any forward. The time spent on them is the median
over repeats of ``before - after``, each pair run seconds apart.

MFU = model FLOPs of one update / its best wall time / the best fp32 ``torch.matmul`` rate
(``--peak-size`` squared, measured before every repeat of the same run, same thread count).
Best against best, because the machine is shared: the least disturbed repeat is the closest to
what the code can do; the median of the per-repeat ratios is printed too. Background load hurts
the update far more than the peak: its thousands of small ops each wait for their slowest
thread, so on a loaded machine try ``--threads 1`` as well. The update keeps the memory it
frees (``pipeline/allocator.py``: glibc otherwise maps and faults in every tensor over 32 MiB
afresh, kernel work that does not shrink with threads); the minor page faults per update are
printed beside each run, and ``--release-memory`` measures the update without it. Model FLOPs are counted from what the update actually
feeds the model (a forward pre-hook reads every call's attention mask and ``logits_to_keep``),
padding excluded. For one sequence of ``S`` real tokens (prompt + completion) with ``c``
completion tokens, one forward is

    2 * N_layers * S  +  2 * N_head * c  +  2 * L * d * S * (S + 1)

with ``N_layers`` the weight-matrix parameters of the decoder layers (embedding lookup and
norms excluded), ``N_head = vocab * hidden`` (counted once even when tied; only the positions
that predict completion tokens reach it, as ``logits_to_keep`` makes it), ``L`` layers and
``d`` the query width: QK^T and AV cost ``4 d`` per (query, key) pair over the causal
triangle's ``S (S + 1) / 2`` pairs. A pass under gradient counts 3 forwards (backward = 2x),
a no-grad scoring pass (old logprobs, reference) 1: per trained token this is PaLM's
``6 N + 12 L d S`` with the causal half of the attention, i.e. ``6 N + 6 L d S``. A prompt is
counted once per completion of its group, as the model runs it. The weight-matmul FLOPs the
update executes, padding included (``torch.utils.flop_counter``), are printed as a multiple of
the model's: a check of the count, and the padding overhead.

Peak memory is the process's peak resident set (VmHWM) during each call, reset in between
through /proc/self/clear_refs; RSS counts torch's CPU tensors, which tracemalloc cannot see.

The last two lines printed are ``mfu: X`` (the default, "after" update) and ``ratio: X`` =
our tokens/s ("before", every row trained, as TRL does) over TRL's tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from machine import cpu_name
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from codepost.pipeline import sharding
from codepost.pipeline.rl.batches import RolloutBatch, collate_rollouts
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig

# Architectures of the models we train, built from their config with random weights (no
# download): the FLOP and memory profile is the architecture's, not the weights'.
PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "vocab_size": 49_152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "layers": 30,
        "heads": 9,
        "kv_heads": 3,
        "tie_embeddings": True,
        "rope_theta": 100_000.0,
        # The default batch (16 rows, about 2k tokens) keeps one update to seconds on 2 cores;
        # the learning config's 48 rows x 256 tokens would take minutes each.
        "repeats": 2,
    },
}


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    heads = args.heads or max(1, args.hidden_size // 64)
    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size or 3 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=args.kv_heads or heads,
        max_position_embeddings=max(1024, args.max_prompt + args.max_completion),
        rope_theta=args.rope_theta,
        tie_word_embeddings=args.tie_embeddings,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def uniform_groups(prompts: int, fraction: float) -> list[bool]:
    """Which groups get one reward for every member: ``round(prompts * fraction)`` of them,
    spread evenly over the batch so that they are not all the first (or longest) prompts."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    count = round(prompts * fraction)
    return [(p + 1) * count // prompts > p * count // prompts for p in range(prompts)]


def build_rows(args: argparse.Namespace) -> list[dict]:
    """Scored rollouts with ragged prompt and completion lengths: the uniform groups all fail
    (reward 0), the others alternate 0 and 1. Rewards draw nothing from the generator, so the
    lengths do not depend on ``--uniform-fraction``."""
    gen = torch.Generator().manual_seed(1)
    uniform = uniform_groups(args.prompts, args.uniform_fraction)
    rows = []
    for p in range(args.prompts):
        prompt_len = int(
            torch.randint(args.max_prompt // 2, args.max_prompt + 1, (), generator=gen)
        )
        prompt = torch.randint(2, args.vocab_size, (prompt_len,), generator=gen).tolist()
        for g in range(args.group_size):
            length = int(
                torch.randint(args.max_completion // 4, args.max_completion + 1, (), generator=gen)
            )
            rows.append(
                {
                    "prompt_id": f"p{p}",
                    "group_index": g,
                    "prompt_ids": prompt,
                    "completion_ids": torch.randint(
                        2, args.vocab_size, (length,), generator=gen
                    ).tolist(),
                    "sampling_logprobs": [-1.0] * length,
                    "finish_reason": "length" if length == args.max_completion else "stop",
                    "temperature": 1.0,
                    "reward": 0.0 if uniform[p] else float(g % 2),
                }
            )
    return rows


def trl_micro_batches(batch: RolloutBatch, advantages: torch.Tensor, micro: int) -> list[dict]:
    """The inputs TRL's ``_generate_and_score_completions`` would hand to its training step,
    shuffled and split like its buffer, each trimmed to its own longest row."""
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(2))
    dicts = []
    for rows in order.split(micro):
        part = batch.select(rows)
        width = part.prompt_ids.shape[1]
        prompt_mask = torch.arange(width)[None, :] >= (width - part.prompt_lengths)[:, None]
        completion_mask = part.response_mask
        dicts.append(
            {
                "prompt_ids": part.prompt_ids,
                "prompt_mask": prompt_mask.long(),
                "completion_ids": part.completion_ids,
                "completion_mask": completion_mask.long(),
                "advantages": advantages[rows],
                "num_items_in_batch": batch.response_mask.sum(),
            }
        )
    return dicts


def forward_flops(
    lengths: Tensor,
    completion_lengths: Tensor,
    *,
    layer_params: int,
    head_params: int,
    layers: int,
    attention_width: int,
) -> tuple[float, float]:
    """Model FLOPs (weight matmuls, attention) of one forward over sequences of ``lengths`` real
    tokens, of which ``completion_lengths`` reach the LM head (the module docstring's formula)."""
    s = lengths.double()
    linear = 2 * layer_params * s.sum() + 2 * head_params * completion_lengths.double().sum()
    attention = 2 * layers * attention_width * (s * (s + 1)).sum()
    return float(linear), float(attention)


class FlopTally:
    """Model FLOPs of every forward a causal LM runs while attached, from its inputs: trained
    passes (under grad) count 3 forwards, scoring passes (no grad) 1."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        config = model.config
        layer_params = sum(p.numel() for p in model.model.layers.parameters() if p.dim() >= 2)
        self.dims = {
            "layer_params": layer_params,
            "head_params": model.get_output_embeddings().weight.numel(),
            "layers": config.num_hidden_layers,
            "attention_width": config.num_attention_heads * config.head_dim,
        }
        self.model = model
        self.linear = 0.0  # weight matmuls, what FlopCounterMode sees on the CPU
        self.attention = 0.0
        self.trained_tokens = 0  # completion tokens that went through a pass under grad
        self.scoring_passes = 0

    def _hook(self, _module: nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        mask = kwargs["attention_mask"]
        width = mask.shape[1]
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, int):  # the last ``keep`` positions, 0 meaning all
            keep = torch.arange(width - (keep or width), width)
        # Position i predicts token i + 1: useful head work only if that token is real.
        predicts = keep.cpu() + 1
        completion = mask[:, predicts[predicts < width]].sum(-1)
        linear, attention = forward_flops(mask.sum(-1), completion, **self.dims)
        passes = 3 if torch.is_grad_enabled() else 1
        self.linear += passes * linear
        self.attention += passes * attention
        if torch.is_grad_enabled():
            self.trained_tokens += int(completion.sum())
        else:
            self.scoring_passes += 1

    @property
    def total(self) -> float:
        return self.linear + self.attention

    @contextlib.contextmanager
    def attached(self) -> Iterator[FlopTally]:
        handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()


def matmul_peak(size: int, repeats: int) -> float:
    """Best fp32 ``torch.matmul`` rate (FLOP/s) on ``size`` x ``size`` operands."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - begin)
    return 2 * size**3 / best


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(step: Callable[[], None]) -> tuple[float, float, int]:
    """Wall time of one call, its peak RSS above the start and its minor page faults."""
    start_rss = rss_mib("VmRSS")
    reset_peak_rss()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    begin = time.perf_counter()
    step()
    seconds = time.perf_counter() - begin
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return seconds, rss_mib("VmHWM") - start_rss, faults


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="a real architecture; overrides the model flags"
    )
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--intermediate-size", type=int, default=None, help="default 3 x hidden")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=None, help="default hidden / 64")
    parser.add_argument("--kv-heads", type=int, default=None, help="default = heads")
    parser.add_argument("--tie-embeddings", action="store_true")
    parser.add_argument("--rope-theta", type=float, default=10_000.0)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-completion", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument(
        "--uniform-fraction",
        type=float,
        default=0.5,
        help="share of groups whose completions all fail (equal rewards: zero advantage)",
    )
    parser.add_argument("--repeats", type=int, default=4, help="timed calls of each run")
    parser.add_argument("--peak-size", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every run and the peak; default torch's (the cores). On a "
        "loaded machine fewer threads than cores can be faster: each op's threads wait for the "
        "slowest, which another process may hold off a core",
    )
    parser.add_argument(
        "--release-memory",
        action="store_true",
        help="glibc's default: tensors over 32 MiB mapped afresh and unmapped on free "
        "(the update without pipeline/allocator.py)",
    )
    # A preset replaces the defaults, so flags given explicitly still win.
    preset = parser.parse_known_args()[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    return parser.parse_args()


def our_updater(model: nn.Module, args: argparse.Namespace, *, drop: bool) -> PolicyUpdater:
    config = UpdateConfig(
        algorithm="grpo",
        loss_agg_mode="token-mean",
        micro_batch_size=args.micro_batch_size,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        policy_loss={"name": "vanilla", "clip_low": 0.2, "clip_high": 0.2},
        drop_uniform_groups=drop,
    )
    return PolicyUpdater(config, copy.deepcopy(model))


def count_flops(updater: PolicyUpdater, batch: RolloutBatch) -> tuple[FlopTally, float]:
    """Model FLOPs of one update (this call is also a warm-up) and the weight-matmul FLOPs it
    actually executes, padding included (FlopCounterMode does not see the CPU's SDPA)."""
    from torch.utils.flop_counter import FlopCounterMode

    tally = FlopTally(updater.policy)
    with FlopCounterMode(display=False) as executed, tally.attached():
        updater.update(batch)
    return tally, float(executed.get_total_flops())


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.release_memory:  # before any trainer starts keeping it
        sharding.keep_freed_memory = lambda: False
    load_at_start = os.getloadavg()[0]

    from datasets import Dataset
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from trl import GRPOConfig, GRPOTrainer

    # TRL wants a tokenizer; the ids below never pass through it
    vocabulary = Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocabulary, pad_token="<pad>")
    model = build_model(args)
    batch = collate_rollouts(build_rows(args))
    tokens = int(batch.completion_lengths.sum())
    all_tokens = tokens + int(batch.prompt_lengths.sum())

    before = our_updater(model, args, drop=False)
    after = our_updater(model, args, drop=True)
    advantages = before.prepare(batch).advantages[:, 0]
    kept = after.prepare(batch).batch
    uniform_rows = len(batch) - len(kept)
    uniform_tokens = tokens - int(kept.completion_lengths.sum())
    flops_before, executed_before = count_flops(before, batch)
    flops_after, executed_after = count_flops(after, batch)

    with tempfile.TemporaryDirectory() as out_dir:
        steps = len(batch) // args.micro_batch_size
        trl_args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=args.micro_batch_size,
            gradient_accumulation_steps=steps,
            num_generations=args.group_size,
            max_completion_length=args.max_completion,
            loss_type="dapo",
            beta=0.0,
            epsilon=0.2,
            learning_rate=1e-6,
            max_grad_norm=1.0,
            bf16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            report_to="none",
        )
        trainer = GRPOTrainer(
            model=copy.deepcopy(model),
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=trl_args,
            train_dataset=Dataset.from_dict({"prompt": ["unused"] * len(batch)}),
            processing_class=tokenizer,
        )
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = steps
        trainer._prepare_inputs = lambda inputs: inputs  # no generation: inputs are given
        micro_inputs = trl_micro_batches(batch, advantages, args.micro_batch_size)
        num_items = batch.response_mask.sum()

        def trl_step() -> None:
            for inputs in micro_inputs:
                trainer.training_step(trainer.model, dict(inputs), num_items)
            trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), 1.0)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        runs: dict[str, Callable[[], None]] = {
            "before": lambda: before.update(batch),
            "after": lambda: after.update(batch),
            "trl": trl_step,
        }
        trl_step()  # warm-up; ours were warmed up by the FLOP count
        times: dict[str, list[float]] = {name: [] for name in runs}
        memory: dict[str, float] = dict.fromkeys(runs, 0.0)
        faults: dict[str, list[int]] = {name: [] for name in runs}
        peaks: list[float] = []
        # One call of each per repeat, the matmul peak just before: a burst of background load
        # hits the repeat's runs alike instead of one run's whole block.
        for _ in range(args.repeats):
            peaks.append(matmul_peak(args.peak_size, repeats=3))
            for name, step in runs.items():
                seconds, rss, step_faults = timed(step)
                times[name].append(seconds)
                faults[name].append(step_faults)
                memory[name] = max(memory[name], rss)

    median = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    peak = max(peaks)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"cpu: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; load average {load_at_start:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end (other processes share these cores)"
    )
    print(
        f"model: Llama {n_params / 1e6:.1f}M params (hidden {model.config.hidden_size}, "
        f"{model.config.num_hidden_layers} layers, vocab {model.config.vocab_size}"
        f"{', preset ' + args.preset if args.preset else ''}); batch: {len(batch)} sequences, "
        f"{tokens} completion tokens ({all_tokens} with prompts), micro-batch "
        f"{args.micro_batch_size}; {uniform_rows} rows in uniform groups "
        f"({uniform_tokens / tokens:.0%} of completion tokens); {args.repeats} repeats"
    )
    print(
        f"peak: {peak / 1e9:.1f} GFLOPS (fp32 {args.peak_size}x{args.peak_size} matmul, best "
        f"of {3 * len(peaks)}; per repeat {', '.join(f'{p / 1e9:.0f}' for p in peaks)})"
    )
    for name, label in (
        ("before", "drop_uniform_groups=False"),
        ("after", "drop_uniform_groups=True"),
    ):
        print(
            f"ours {name:6s} ({label}): {tokens / median[name]:8.1f} tokens/s (median "
            f"{median[name]:.3f} s/update, best {best[name]:.3f}), peak RSS +{memory[name]:.0f} MiB"
            f", {statistics.median(faults[name]):.0f} minor page faults/update"
        )
    print(
        f"trl : {tokens / median['trl']:8.1f} tokens/s (median {median['trl']:.3f} s/step, "
        f"best {best['trl']:.3f}), peak RSS +{memory['trl']:.0f} MiB"
    )
    # Paired per repeat: before and after ran seconds apart, under the same background load.
    wasted = [b - a for b, a in zip(times["before"], times["after"], strict=True)]
    share = [w / b for w, b in zip(wasted, times["before"], strict=True)]
    speedup = [b / a for b, a in zip(times["before"], times["after"], strict=True)]
    print(
        f"zero-advantage groups: before {statistics.median(wasted):.3f} s/update "
        f"({statistics.median(share):.0%} of the update, {median['before']:.3f} s); after 0 s by "
        f"construction (update {median['after']:.3f} s); speed-up "
        f"{statistics.median(speedup):.2f}x (medians of per-repeat pairs)"
    )
    for name, tally, executed in (
        ("before", flops_before, executed_before),
        ("after", flops_after, executed_after),
    ):
        paired = [tally.total / t / p for t, p in zip(times[name], peaks, strict=True)]
        print(
            f"flops {name}: model {tally.total / 1e9:.1f} GFLOP/update (attention "
            f"{tally.attention / tally.total:.0%}; {tally.trained_tokens} trained tokens, "
            f"{tally.scoring_passes} no-grad forwards; weight matmuls executed "
            f"{executed / tally.linear:.2f}x the model's, padding included); "
            f"{tally.total / best[name] / 1e9:.1f} GFLOPS best, "
            f"{tally.total / median[name] / 1e9:.1f} median; mfu "
            f"{tally.total / best[name] / peak:.2f} best/best, "
            f"{statistics.median(paired):.2f} median of per-repeat ratios"
        )
    print(f"mfu: {flops_after.total / best['after'] / peak:.2f}")
    print(f"ratio: {median['trl'] / median['before']:.2f}")


if __name__ == "__main__":
    main()
