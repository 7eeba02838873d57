"""DPO / IPO stage: TRL's losses against the seed's formulas by hand, publishing, skipping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from stage_helpers import mined_pairs, mixed_group, save_tiny_model, write_rollouts
from transformers import AutoModelForCausalLM

from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish, read_manifest
from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import build_prompt
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer
from codepost.pipeline.stages.dpo import DPOStageConfig, dpo_trainer, run_dpo
from codepost.pipeline.stages.pairs import PairMiningConfig, run_pair_mining
from codepost.pipeline.training import TrainingSettings
from codepost.verifiers.problems import MBPP

PAIRS = [
    ("def f(x):\n", "    return x + 1\n", "    return x\n"),
    ("def g(a, b):\n", "    return a * b\n", "    return a + b + 1\n"),
    ("def h(s):\n", "    return s[::-1]\n", "    return s\n"),
]
BETA = 0.25


def completion_logps(
    model: torch.nn.Module, tokenizer: Any, prompt: str, completion: str
) -> tuple[float, int]:
    """log pi(completion | prompt), summed over the completion's tokens (EOS included)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    completion_ids = tokenizer(completion, add_special_tokens=False).input_ids
    completion_ids.append(tokenizer.eos_token_id)
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logprobs = F.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    per_token = logprobs.gather(-1, targets[:, None])[:, 0]
    return per_token[len(prompt_ids) - 1 :].sum().item(), len(completion_ids)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_trainer_loss_equals_the_seed_formulas(tmp_path: Path, loss_type: str) -> None:
    """The stage's trainer on a fixed batch, against DPO and IPO computed by hand.

    DPO (seed 001, 7.2): -log sigma(beta * (log-ratio(chosen) - log-ratio(rejected))), the
    log-ratio being log pi_theta(y|x) - log pi_ref(y|x) summed over tokens.
    IPO (seed 001, 8.1): (u - 1/(2 tau))^2 with tau = beta, where TRL takes u from log-ratios
    averaged per completion token (the IPO authors' normalisation, documented in TRL).
    """
    model_config = save_tiny_model(tmp_path / "model")
    config = DPOStageConfig(model=model_config, loss_type=loss_type, beta=BETA)
    train = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    trainer = dpo_trainer(config, train, None, tmp_path / "trainer")
    # Move the policy away from the reference so the log-ratios are not all zero.
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for parameter in trainer.model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(PAIRS))])
    trainer_loss = trainer.compute_loss(trainer.model, batch).item()

    tokenizer = load_tokenizer(model_config)
    reference = load_causal_lm(model_config)
    policy = load_causal_lm(model_config)
    policy.load_state_dict(trainer.model.state_dict())
    losses, ref_chosen = [], []
    for prompt, chosen, rejected in PAIRS:
        pc, n_chosen = completion_logps(policy, tokenizer, prompt, chosen)
        pr, n_rejected = completion_logps(policy, tokenizer, prompt, rejected)
        rc, _ = completion_logps(reference, tokenizer, prompt, chosen)
        rr, _ = completion_logps(reference, tokenizer, prompt, rejected)
        ref_chosen.append(rc)
        if loss_type == "sigmoid":
            u = torch.tensor((pc - rc) - (pr - rr))
            losses.append(-F.logsigmoid(BETA * u).item())
        else:
            u = (pc - rc) / n_chosen - (pr - rr) / n_rejected
            losses.append((u - 1 / (2 * BETA)) ** 2)
    assert batch["ref_chosen_logps"].tolist() == pytest.approx(ref_chosen, abs=1e-4)
    by_hand = sum(losses) / len(losses)
    assert trainer_loss == pytest.approx(by_hand, rel=1e-4, abs=1e-5)
    assert abs(by_hand - (0.693147 if loss_type == "sigmoid" else (1 / (2 * BETA)) ** 2)) > 1e-3


def test_run_dpo_publishes_a_merged_checkpoint_with_held_out_metrics(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model").model_copy(update={"lora_r": 4})
    config = DPOStageConfig(
        model=model,
        loss_type="ipo",
        training=TrainingSettings(
            max_steps=3, learning_rate=1e-2, per_device_train_batch_size=4, max_length=256
        ),
    )
    pairs = mined_pairs(tmp_path)
    result = run_dpo(config, pairs, tmp_path / "dpo")
    manifest = read_manifest(result.checkpoint)
    assert manifest.stage == "dpo" and manifest.parent == model.name_or_path
    assert manifest.data == {"pairs": read_manifest(pairs).version}
    before, after = result.metrics["held_out_before"], result.metrics["held_out_after"]
    # policy == reference before the first step: zero implicit rewards, no preference yet
    assert before["rewards/margins"] == 0 and before["rewards/accuracies"] == 0
    assert after["rewards/margins"] != 0 and after["loss"] != before["loss"]
    assert result.metrics["steps"] == 3
    # LoRA merged: a plain transformers model, with weights that moved
    assert not list(result.checkpoint.glob("adapter_*"))
    trained = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    original = AutoModelForCausalLM.from_pretrained(model.name_or_path)
    assert not torch.equal(
        trained.model.layers[0].mlp.up_proj.weight, original.model.layers[0].mlp.up_proj.weight
    )
    # a rerun finds it; another config in the same folder is refused
    assert run_dpo(config, pairs, tmp_path / "dpo").metrics == result.metrics
    with pytest.raises(FileExistsError, match="another config"):
        run_dpo(config.model_copy(update={"beta": 0.5}), pairs, tmp_path / "dpo")


def test_run_dpo_skips_without_pairs_and_names_bad_input(tmp_path: Path) -> None:
    result = run_dpo(DPOStageConfig(), None, tmp_path / "dpo")
    assert result.checkpoint is None and "no pairs" in result.metrics["skipped"]
    assert not (tmp_path / "dpo").exists()
    with pytest.raises(FileNotFoundError, match="not a published checkpoint"):
        run_dpo(DPOStageConfig(), tmp_path / "nowhere", tmp_path / "dpo")
    # pairs sampled by another checkpoint: that one, not this model, is their reference
    rows = [{**row, "sampler_weights": str(tmp_path / "policy")} for row in mixed_group("p0")]
    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows)
    pairs = run_pair_mining(PairMiningConfig(), rollouts, tmp_path / "pairs").path
    assert read_manifest(pairs).data["sampler_weights"] == str(tmp_path / "policy")
    model = save_tiny_model(tmp_path / "other")
    with pytest.raises(ValueError, match=r"sampled by .*policy"):
        run_dpo(DPOStageConfig(model=model), pairs, tmp_path / "dpo")


def pairs_manifest() -> CheckpointManifest:
    return CheckpointManifest(stage="pairs", version="pairs-by-hand")


@pytest.mark.slow
def test_dpo_on_smollm2(tmp_path: Path) -> None:
    """Two DPO steps on the real model with chat prompts: trains, publishes, reloads."""
    model = ModelConfig()
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(ProblemSet(source=MBPP, split="train", limit=3))
    rows = []
    for problem in problems.values():
        prompt = build_prompt(problem, tokenizer).text
        chosen = f"```python\n{problem.canonical_solution.strip()}\n```"
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": "```python\npass\n```"})
    train = Dataset.from_list(rows)
    pairs = tmp_path / "pairs"
    dataset = DatasetDict({"train": train.select(range(2)), "test": train.select([2])})
    publish(pairs, lambda folder: dataset.save_to_disk(str(folder)), pairs_manifest())
    config = DPOStageConfig(
        loss_type="sigmoid",
        training=TrainingSettings(
            max_steps=2, learning_rate=1e-5, per_device_train_batch_size=1, max_length=384
        ),
    )
    result = run_dpo(config, pairs, tmp_path / "dpo")
    after = result.metrics["held_out_after"]
    assert result.metrics["held_out_before"]["rewards/margins"] == 0
    assert torch.isfinite(torch.tensor(after["loss"])) and after["rewards/margins"] != 0
    AutoModelForCausalLM.from_pretrained(result.checkpoint)
