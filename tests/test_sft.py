"""SFT stage: the sampler's prompts and the verifier's answer format, completion-only loss,
training that fits the references, a merged checkpoint, resuming, and bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stage_helpers import TINY_PROBLEMS, save_tiny_model, tiny_problem_set
from transformers import AutoModelForCausalLM

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.data.problem_sets import ProblemSet, fingerprint, load_problem_set
from codepost.pipeline.data.prompts import build_prompt, reference_answer
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.pipeline.stages.sft import SFTStageConfig, run_sft, sft_dataset, sft_trainer
from codepost.pipeline.training import TrainingSettings, trainer_arguments
from codepost.verifiers.problems import MBPP


def reference_nll(checkpoint: Path, problems: ProblemSet) -> float:
    """Mean negative log-likelihood of the reference answers (+ EOS) after their prompts."""
    config = ModelConfig(name_or_path=str(checkpoint))
    tokenizer = load_tokenizer(config)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    losses = []
    for row in sft_dataset(load_problem_set(problems), tokenizer, "chat"):
        prompt = tokenizer(row["prompt"]).input_ids
        completion = [*tokenizer(row["completion"]).input_ids, tokenizer.eos_token_id]
        ids = torch.tensor([prompt + completion])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        with torch.no_grad():
            losses.append(model(ids, labels=labels).loss.item())
    return sum(losses) / len(losses)


def test_rows_are_the_sampler_prompts_and_loss_covers_only_the_answer(tmp_path: Path) -> None:
    config = SFTStageConfig(model=save_tiny_model(tmp_path / "model"))
    problems = load_problem_set(tiny_problem_set(tmp_path))
    tokenizer = load_tokenizer(config.model)
    dataset = sft_dataset(problems, tokenizer, "chat")
    for row, problem in zip(dataset, problems.values(), strict=True):
        assert row["prompt"] == build_prompt(problem, tokenizer, "chat").text
        assert row["completion"] == reference_answer(problem, "chat")
    trainer = sft_trainer(config, dataset, tokenizer, tmp_path / "trainer")
    for example, row in zip(trainer.train_dataset, dataset, strict=True):
        trained = [label for label in example["labels"] if label != -100]
        assert tokenizer.decode(trained) == row["completion"] + tokenizer.eos_token


def test_run_sft_fits_the_references_and_publishes_a_checkpoint(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model")  # full fine-tuning (the DPO test covers LoRA)
    problems = tiny_problem_set(tmp_path)
    config = SFTStageConfig(
        model=model,
        problems=problems,
        training=TrainingSettings(max_steps=8, learning_rate=5e-3, per_device_train_batch_size=3),
    )
    checkpoint = run_sft(config, tmp_path / "sft")
    manifest = read_manifest(checkpoint)
    assert manifest.stage == "sft" and manifest.parent == model.name_or_path
    assert manifest.data == {"problems": fingerprint(load_problem_set(problems))}
    assert manifest.metrics["examples"] == len(TINY_PROBLEMS) and manifest.metrics["steps"] == 8
    assert verify(checkpoint) == []
    assert AutoModelForCausalLM.from_pretrained(checkpoint).config.use_cache  # serves fast
    before = reference_nll(Path(model.name_or_path), problems)
    after = reference_nll(checkpoint, problems)
    assert after < before - 0.5, (before, after)
    # a rerun finds it; another config in the same folder is refused
    assert run_sft(config, tmp_path / "sft") == checkpoint
    with pytest.raises(FileExistsError, match="another config"):
        run_sft(config.model_copy(update={"prompt_style": "continuation"}), tmp_path / "sft")


def test_bad_input_is_named(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(save_tiny_model(tmp_path / "model"))
    problems = load_problem_set(tiny_problem_set(tmp_path))
    with pytest.raises(ValueError, match="continuation prompts need a code prompt"):
        sft_dataset(problems, tokenizer, "continuation")
    unsolved = {k: p.model_copy(update={"canonical_solution": None}) for k, p in problems.items()}
    with pytest.raises(ValueError, match="has a reference solution"):
        sft_dataset(unsolved, tokenizer, "chat")


@pytest.mark.slow
def test_sft_on_smollm2(tmp_path: Path) -> None:
    """Two steps on the real model and MBPP train: publishes a checkpoint transformers loads."""
    problems = ProblemSet(source=MBPP, split="train", limit=2)
    config = SFTStageConfig(
        problems=problems,
        training=TrainingSettings(max_steps=2, per_device_train_batch_size=1, learning_rate=1e-5),
    )
    checkpoint = run_sft(config, tmp_path / "sft")
    assert read_manifest(checkpoint).metrics["steps"] == 2
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.config.model_type == "llama"


def test_lora_under_fsdp_is_refused_before_anything_is_set_up(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # as `accelerate launch` sets it
    with pytest.raises(ValueError, match="LoRA under FSDP is not supported"):
        trainer_arguments(TrainingSettings(), ModelConfig(lora_r=8), tmp_path)
