"""The update and SFT stages on 2 processes (``accelerate launch``, DDP over gloo on the CPU)
through :func:`codepost.pipeline.launch.launch_stage` give what one process gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import load_file
from stage_helpers import save_tiny_model
from update_cases import random_rows

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.data.rows import SCORED_COLUMNS, write_rows
from codepost.pipeline.launch import LaunchConfig, LaunchFailed, launch_stage
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages import Artifacts, Stage, get_stage, run_stage
from codepost.pipeline.stages.rl import UpdateStageConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings

pytestmark = pytest.mark.slow


def launch(
    processes: int, stage: str, config: BaseModel, inputs: Artifacts, folder: Path
) -> tuple[Artifacts, Path]:
    """``stage`` on ``processes`` CPU ranks through the launch entry, under the resume rule of
    this process (as ``codepost run`` runs it): the outputs the main process printed, the out
    root."""
    lines: list[str] = []

    def on_ranks(stage: Stage, config: BaseModel, inputs: Artifacts, out_dir: Path, label: str):
        launch = LaunchConfig(num_processes=processes)
        return launch_stage(stage, config, inputs, out_dir, launch, forward=lines.append)

    outputs = run_stage(get_stage(stage), config, inputs, folder / "out", on_ranks)
    assert f"{stage} on {processes} process(es)" in "\n".join(lines)
    return outputs, folder / "out"


def test_a_stage_that_is_not_rank_aware_is_refused_on_two_processes(tmp_path: Path) -> None:
    pairs = get_stage("pairs")
    with pytest.raises(LaunchFailed) as failed:
        launch_stage(
            pairs, pairs.config(), Artifacts(), tmp_path / "out", LaunchConfig(num_processes=2)
        )
    assert "stage 'pairs' runs in one process only" in str(failed.value)
    assert "pairs on 2 processes failed (exit status" in str(failed.value)
    assert not (tmp_path / "out").exists()


def scored_rollouts(path: Path, model: ModelConfig) -> Path:
    """Scored rows of the rows contract: random token ids of the tiny model's vocabulary."""
    rows: list[dict[str, Any]] = random_rows(
        len(load_tokenizer(model)), num_prompts=6, group_size=3
    )
    for row in rows:
        passed = row["reward"] == 1.0
        row.update(
            prompt=f"task {row['prompt_id']}",
            completion="...",
            completion_style="continuation",
            top_p=1.0,
            sampler="test",
            passed=passed,
            status="passed" if passed else "failed",
            pass_fraction=float(passed),
            excluded=False,
        )
    return write_rows(rows, path, SCORED_COLUMNS)


def test_an_update_on_two_ranks_gives_the_weights_of_one(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model")
    scored = scored_rollouts(tmp_path / "scored.parquet", model)
    lr = 1e-3
    # 18 rows, 15 after dropping uniform groups; minibatches of 5 in micro-batches of 2 over
    # two epochs: 6 optimizer steps, rank 1 padding a zero-weight row (the invariance test's case)
    config = UpdateStageConfig(
        model=model,
        update=UpdateConfig(
            algorithm="grpo",
            loss_agg_mode="seq-mean-token-sum",
            lr=lr,
            epochs=2,
            minibatch_size=5,
            micro_batch_size=2,
        ),
    )
    stage, inputs = get_stage("update"), Artifacts(scored=str(scored))
    one = Path(str(run_stage(stage, config, inputs, tmp_path / "one").checkpoint))
    outputs, out_root = launch(2, "update", config, inputs, tmp_path / "two")
    two = Path(str(outputs.checkpoint))

    assert two.parent == out_root and two.name == one.name  # the same key: same config, inputs
    assert verify(two) == [] and (out_root / f"{two.name}.json").is_file()
    assert sorted(p.name for p in out_root.iterdir()) == [two.name, f"{two.name}.json"]
    single, ddp = (read_manifest(c).metrics for c in (one, two))
    assert ddp["update/optimizer_steps"] == single["update/optimizer_steps"] == 6
    assert ddp["update/loss"] == pytest.approx(single["update/loss"], rel=1e-4, abs=1e-7)
    before = load_file(Path(model.name_or_path) / "model.safetensors")
    weights_one, weights_two = (load_file(c / "model.safetensors") for c in (one, two))
    assert weights_one.keys() == weights_two.keys()
    moved = max((weights_one[k] - before[k]).abs().max().item() for k in before)
    diff = max((weights_one[k] - weights_two[k]).abs().max().item() for k in weights_one)
    print(f"\nupdate: max |w(1 rank) - w(2 ranks)| = {diff:.3g}; max |step| = {moved:.3g}")
    assert moved > 1e-4  # the update moved the weights: the comparison is not vacuous
    for name in weights_one:
        # Adam's noise on ~0-gradient coordinates is a fraction of lr (test_update_invariance)
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=0, atol=0.05 * lr)


def problem_set(folder: Path, count: int) -> ProblemSet:
    """``count`` MBPP-style problems with reference solutions of different lengths."""
    path = folder / "problems.jsonl"
    rows = [
        {
            "task_id": i,
            "text": f"Add {i} to a number.",
            "code": f"def add_{i}(x):\n    " + "y = x\n    " * (i % 4) + f"return x + {i}",
            "test_list": [f"assert add_{i}(1) == {i + 1}"],
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ProblemSet(source=str(path), split="all")


def test_sft_on_two_ranks_follows_the_loss_of_one_at_the_same_global_batch(
    tmp_path: Path,
) -> None:
    model = save_tiny_model(tmp_path / "model")
    settings = {"max_steps": 6, "learning_rate": 5e-3, "logging_steps": 1}

    def config(per_device: int) -> SFTStageConfig:
        return SFTStageConfig(
            model=model,
            problems=problem_set(tmp_path, 16),
            prompt_style="chat",
            training=TrainingSettings(**settings, per_device_train_batch_size=per_device),
        )

    outputs, out_root = launch(1, "sft", config(4), Artifacts(), tmp_path / "one")
    one = read_manifest(Path(str(outputs.checkpoint))).metrics
    outputs, out_root = launch(2, "sft", config(2), Artifacts(), tmp_path / "two")
    checkpoint = Path(str(outputs.checkpoint))
    two = read_manifest(checkpoint).metrics
    assert verify(checkpoint) == [] and (out_root / f"{checkpoint.name}.json").is_file()
    print(f"\nsft losses, 1 rank x 4: {one['losses']}\nsft losses, 2 ranks x 2: {two['losses']}")
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert one["losses"][-1] < one["losses"][0]  # it learns: the comparison is not vacuous
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
