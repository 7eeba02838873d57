"""The update, SFT and DPO stages on 2 processes (``accelerate launch``, DDP over gloo on the CPU)
through the ``codepost.pipeline.launch`` entry give what one process gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import load_file
from stage_helpers import mined_pairs, save_tiny_model
from update_cases import random_rows

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.data.rows import SCORED_COLUMNS, write_rows
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages import Artifacts, get_stage, run_stage
from codepost.pipeline.stages.dpo import DPOStageConfig
from codepost.pipeline.stages.rl import UpdateStageConfig
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings

pytestmark = pytest.mark.slow

# accelerate's console script beside this interpreter (the project's virtual environment)
ACCELERATE = Path(sys.executable).with_name("accelerate")


def launch_command(
    processes: int, stage: str, config: BaseModel, inputs: Artifacts, folder: Path
) -> subprocess.CompletedProcess[str]:
    """``stage`` on ``processes`` CPU ranks through the launch entry, into ``folder/out``."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config.model_dump_json())
    (folder / "inputs.json").write_text(inputs.model_dump_json())
    command = [
        str(ACCELERATE),
        "launch",
        *(["--multi_gpu"] if processes > 1 else []),  # with ACCELERATE_USE_CPU: DDP over gloo
        f"--num_processes={processes}",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        "--main_process_port=0",
        "-m",
        "codepost.pipeline.launch",
        stage,
        f"--config={folder / 'config.json'}",
        f"--inputs={folder / 'inputs.json'}",
        f"--out-root={folder / 'out'}",
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def launch(
    processes: int, stage: str, config: BaseModel, inputs: Artifacts, folder: Path
) -> tuple[Artifacts, Path]:
    """A launch that must succeed: the outputs the main process printed, the out root."""
    done = launch_command(processes, stage, config, inputs, folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{stage} on {processes} process(es)" in done.stderr
    outputs = Artifacts.model_validate_json(done.stdout.strip().splitlines()[-1])
    return outputs, folder / "out"


def test_a_stage_that_is_not_rank_aware_is_refused_on_two_processes(tmp_path: Path) -> None:
    pairs = get_stage("pairs")
    done = launch_command(2, "pairs", pairs.config(), Artifacts(), tmp_path / "pairs")
    assert done.returncode != 0
    assert "stage 'pairs' runs in one process only" in done.stderr
    assert not (tmp_path / "pairs" / "out").exists()


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


def test_dpo_on_two_ranks_follows_the_loss_of_one_at_the_same_global_batch(
    tmp_path: Path,
) -> None:
    model = save_tiny_model(tmp_path / "model")
    settings = {"max_steps": 6, "learning_rate": 5e-3, "logging_steps": 1, "max_length": 256}

    def run(processes: int, per_device: int) -> tuple[Path, Path]:
        """DPO on 12 mined pairs (4 held out), into a folder of its own with pairs of its own:
        TRL caches the reference log-probs beside the pairs' files, and a run sharing them
        would reuse the other's instead of computing them on its ranks."""
        folder = tmp_path / f"{processes}-ranks"
        folder.mkdir()
        config = DPOStageConfig(
            model=model,
            training=TrainingSettings(**settings, per_device_train_batch_size=per_device),
        )
        inputs = Artifacts(pairs=str(mined_pairs(folder)))
        outputs, out_root = launch(processes, "dpo", config, inputs, folder / "launch")
        return Path(str(outputs.checkpoint)), out_root

    one = read_manifest(run(1, 2)[0]).metrics
    checkpoint, out_root = run(2, 1)
    two = read_manifest(checkpoint).metrics
    assert verify(checkpoint) == [] and (out_root / f"{checkpoint.name}.json").is_file()
    assert sorted(p.name for p in out_root.iterdir()) == [
        checkpoint.name,
        f"{checkpoint.name}.json",
    ]
    print(f"\ndpo losses, 1 rank x 2: {one['losses']}\ndpo losses, 2 ranks x 1: {two['losses']}")
    held_out_one, held_out_two = (m["held_out_after"]["loss"] for m in (one, two))
    print(f"dpo held-out loss after, 1 rank: {held_out_one}; 2 ranks: {held_out_two}")
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert one["losses"][-1] < one["losses"][0]  # it learns: the comparison is not vacuous
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    # the held-out pairs scored before training (policy = reference) and by the published model
    assert two["held_out_before"] == pytest.approx(one["held_out_before"], abs=1e-6)
    assert held_out_two == pytest.approx(held_out_one, rel=1e-4)
