"""Tokens per second of our GRPO update vs TRL 1.16 ``GRPOTrainer``'s training step.

Same model weights, same scored batch, same settings (DAPO-style token-mean loss, clip 0.2,
beta 0, AdamW, grad clip 1.0, fp32, micro-batches of ``--micro-batch-size``, one optimizer step
per batch). TRL's step is its own ``training_step`` (compute_loss + backward) over the
micro-batches, then clip, optimizer step and zero_grad, with generation switched off: the
inputs are the dicts its ``_generate_and_score_completions`` would have produced. Each TRL
micro-batch is trimmed to its own longest row (TRL pads all of them to the generation batch's
longest: the trim only helps TRL). Ours is ``PolicyUpdater.update`` on the rollout batch,
batch shaping and advantage computation included.

Peak memory is the process's peak resident set (VmHWM) during each phase, reset in between
through /proc/self/clear_refs; RSS counts torch's CPU tensors, which tracemalloc cannot see.

The last line printed is ``ratio: X`` = our tokens/s over TRL's tokens/s.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from codepost.pipeline.models import char_tokenizer
from codepost.pipeline.policy_update import PolicyUpdater, UpdateConfig
from codepost.pipeline.rollouts import RolloutBatch, collate_rollouts


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden_size // 64),
        num_key_value_heads=max(1, args.hidden_size // 64),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def build_rows(args: argparse.Namespace) -> list[dict]:
    """Scored rollouts with ragged prompt and completion lengths, two rewards per group."""
    gen = torch.Generator().manual_seed(1)
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
                    "reward": float(g % 2),
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


def timed(step: Callable[[], None], repeats: int) -> tuple[list[float], float]:
    """Wall times of ``repeats`` calls (after one warm-up) and the peak RSS above the start."""
    step()
    start_rss = rss_mib("VmRSS")
    reset_peak_rss()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return times, rss_mib("VmHWM") - start_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-completion", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = char_tokenizer("abc")  # TRL wants one; the ids below never pass through it
    model = build_model(args)
    batch = collate_rollouts(build_rows(args))
    tokens = int(batch.completion_lengths.sum())

    config = UpdateConfig(
        algorithm="grpo",
        loss_agg_mode="token-mean",
        micro_batch_size=args.micro_batch_size,
        lr=1e-6,
        max_grad_norm=1.0,
        clip_low=0.2,
        clip_high=0.2,
        drop_uniform_groups=False,
    )
    updater = PolicyUpdater(config, copy.deepcopy(model))
    advantages = updater.prepare(batch).advantages[:, 0]

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

        def our_step() -> None:
            updater.update(batch)

        ours_times, ours_mem = [], 0.0
        trl_times, trl_mem = [], 0.0
        for _ in range(2):  # alternate, so background load hits both alike
            t, m = timed(our_step, args.repeats)
            ours_times += t
            ours_mem = max(ours_mem, m)
            t, m = timed(trl_step, args.repeats)
            trl_times += t
            trl_mem = max(trl_mem, m)

    ours_tps = tokens / statistics.median(ours_times)
    trl_tps = tokens / statistics.median(trl_times)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama {n_params / 1e6:.1f}M params (hidden {args.hidden_size}, "
        f"{args.layers} layers, vocab {args.vocab_size}); batch: {len(batch)} sequences, "
        f"{tokens} completion tokens, micro-batch {args.micro_batch_size}; "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"ours: {ours_tps:8.1f} tokens/s (median {statistics.median(ours_times):.3f} s/update), "
        f"peak RSS +{ours_mem:.0f} MiB"
    )
    print(
        f"trl : {trl_tps:8.1f} tokens/s (median {statistics.median(trl_times):.3f} s/step), "
        f"peak RSS +{trl_mem:.0f} MiB"
    )
    print(f"ratio: {ours_tps / trl_tps:.2f}")


if __name__ == "__main__":
    main()
