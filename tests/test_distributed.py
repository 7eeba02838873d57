"""The update, SFT, DPO and RL stages on 2 processes (``accelerate launch``, DDP over gloo on the
CPU) through :func:`codepost.pipeline.launch.launch_stage` give what one process gives, and an RL
run killed on 2 processes resumes on 1 and on 2."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from processes import gone, wait_until
from pydantic import BaseModel
from safetensors.torch import load_file
from stage_helpers import SIGNAL, mined_pairs, save_tiny_model
from update_cases import random_rows

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.data.rows import SCORED_COLUMNS, read_rows, write_rows
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.launch import (
    LaunchConfig,
    LaunchFailed,
    kill_process_tree,
    launch_command,
    launch_stage,
)
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.rl.trainer_state import SCALARS, TENSORS
from codepost.pipeline.stages import Artifacts, Stage, get_stage, run_stage
from codepost.pipeline.stages.dpo import DPOStageConfig
from codepost.pipeline.stages.rl import (
    RLConfig,
    UpdateStageConfig,
    iteration_dir,
    last_published_iteration,
)
from codepost.pipeline.stages.sft import SFTStageConfig
from codepost.pipeline.training import TrainingSettings

pytestmark = pytest.mark.slow


FSDP2 = str(Path(__file__).parents[1] / "configs" / "accelerate" / "fsdp2.yaml")


def launched(
    processes: int,
    stage: str,
    config: BaseModel,
    inputs: Artifacts,
    folder: Path,
    accelerate_config: str | None = None,
) -> subprocess.Popen[str]:
    """The entry started on its own under its resume rule (``--out-root folder/out``), with the
    command the pipeline builds: a test may kill it mid-run."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.model_dump_json())
    (folder / "inputs.json").write_text(inputs.model_dump_json())
    entry_args = [
        stage,
        f"--config={folder / 'config.json'}",
        f"--inputs={folder / 'inputs.json'}",
        f"--out-root={folder / 'out'}",
    ]
    launch = LaunchConfig(num_processes=processes, accelerate_config=accelerate_config)
    command, env = launch_command(launch, entry_args, on_cpu=True)
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def launch(
    processes: int,
    stage: str,
    config: BaseModel,
    inputs: Artifacts,
    folder: Path,
    accelerate_config: str | None = None,
) -> tuple[Artifacts, Path]:
    """``stage`` on ``processes`` CPU ranks through the launch entry (DDP, or the setup of
    ``accelerate_config``), under the resume rule of this process (as ``codepost run`` runs
    it): the outputs the main process printed, the out root."""
    lines: list[str] = []

    def on_ranks(stage: Stage, config: BaseModel, inputs: Artifacts, out_dir: Path, label: str):
        launch = LaunchConfig(num_processes=processes, accelerate_config=accelerate_config)
        return launch_stage(stage, config, inputs, out_dir, launch, forward=lines.append)

    outputs = run_stage(get_stage(stage), config, inputs, folder / "out", on_ranks)
    assert f"{stage} on {processes} process(es)" in "\n".join(lines)
    sharded = [line for line in lines if "FSDP2" in line]  # what the stages say when sharded
    assert bool(sharded) == (accelerate_config == FSDP2), sharded
    printed = [line for line in lines if line.startswith(f"{stage}: ")]
    assert len(printed) == len(set(printed)), printed  # by the main process alone
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


def test_an_interrupted_launch_leaves_no_rank_running(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model")
    config = SFTStageConfig(model=model, problems=problem_set(tmp_path, 16), prompt_style="chat")
    ranks: list[psutil.Process] = []
    earlier = set(psutil.Process().children(recursive=True))  # e.g. an earlier test's engine

    def interrupt_once_running(line: str) -> None:
        if "sft on 2 process(es)" in line:  # both ranks are up: the process group is formed
            ranks.extend(set(psutil.Process().children(recursive=True)) - earlier)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch_stage(
            get_stage("sft"),
            config,
            Artifacts(),
            tmp_path / "out",
            LaunchConfig(num_processes=2),
            forward=interrupt_once_running,
        )
    # the launcher (torchrun's agent runs in it) and its 2 ranks, each in a session of its own
    assert len(ranks) >= 3
    assert wait_until(lambda: all(gone(rank.pid) for rank in ranks), timeout=10)


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


@pytest.mark.parametrize(("sharding", "algorithm"), [("ddp", "grpo"), ("fsdp", "ppo")])
def test_an_update_on_two_ranks_gives_the_weights_of_one(
    tmp_path: Path, sharding: str, algorithm: str
) -> None:
    """DDP, or FSDP2 (a PPO critic sharded too): the weights and the whole trainer state of
    one process."""
    model = save_tiny_model(tmp_path / "model")
    scored = scored_rollouts(tmp_path / "scored.parquet", model)
    lr = 1e-3
    # 18 rows, 15 after dropping uniform groups; minibatches of 5 in micro-batches of 2 over
    # two epochs: 6 optimizer steps, rank 1 padding a zero-weight row (the invariance test's case)
    config = UpdateStageConfig(
        model=model,
        update=UpdateConfig(
            algorithm=algorithm,
            loss_agg_mode="seq-mean-token-sum",
            learning_rate=lr,
            epochs=2,
            minibatch_size=5,
            micro_batch_size=2,
        ),
    )
    stage, inputs = get_stage("update"), Artifacts(scored=str(scored))
    one = Path(str(run_stage(stage, config, inputs, tmp_path / "one").checkpoint))
    fsdp = FSDP2 if sharding == "fsdp" else None
    outputs, out_root = launch(2, "update", config, inputs, tmp_path / "two", fsdp)
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
    print(
        f"\nupdate, {sharding} {algorithm}: max |w(1 rank) - w(2 ranks)| = {diff:.3g}; "
        f"max |step| = {moved:.3g}"
    )
    assert moved > 1e-4  # the update moved the weights: the comparison is not vacuous
    for name in weights_one:
        # Adam's noise on ~0-gradient coordinates is a fraction of lr (test_update_invariance)
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=0, atol=0.05 * lr)
    # The trainer state too, whole and numbered as one process numbers it (FSDP: gathered).
    states = [load_file(c / TENSORS) for c in (one, two)]
    assert states[0].keys() == states[1].keys() and len(states[0]) > 1
    for name, tensor in states[0].items():
        torch.testing.assert_close(states[1][name], tensor, rtol=1e-3, atol=1e-6)
    scalars = [json.loads((c / SCALARS).read_text())["optimizer"] for c in (one, two)]
    assert scalars[0] == scalars[1]


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


@pytest.mark.parametrize("sharding", ["fsdp"])  # DDP: the DPO test (both go through TRL)
def test_sft_on_two_ranks_follows_the_loss_of_one_at_the_same_global_batch(
    tmp_path: Path, sharding: str
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
    single = Path(str(outputs.checkpoint))
    one = read_manifest(single).metrics
    fsdp = FSDP2 if sharding == "fsdp" else None
    outputs, out_root = launch(2, "sft", config(2), Artifacts(), tmp_path / "two", fsdp)
    checkpoint = Path(str(outputs.checkpoint))
    two = read_manifest(checkpoint).metrics
    assert verify(checkpoint) == [] and (out_root / f"{checkpoint.name}.json").is_file()
    print(f"\nsft losses, 1 rank x 4: {one['losses']}\n{sharding}, 2 ranks x 2: {two['losses']}")
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert one["losses"][-1] < one["losses"][0]  # it learns: the comparison is not vacuous
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    weights_one, weights_two = (load_file(c / "model.safetensors") for c in (single, checkpoint))
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():  # published whole (FSDP: gathered)
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=5e-5)


@pytest.mark.parametrize("sharding", ["ddp"])  # FSDP2: the SFT test
def test_dpo_on_two_ranks_follows_the_loss_of_one_at_the_same_global_batch(
    tmp_path: Path, sharding: str
) -> None:
    model = save_tiny_model(tmp_path / "model")
    settings = {"max_steps": 6, "learning_rate": 5e-3, "logging_steps": 1, "max_length": 256}

    def run(processes: int, per_device: int, setup: str | None = None) -> tuple[Path, Path]:
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
        outputs, out_root = launch(processes, "dpo", config, inputs, folder / "launch", setup)
        return Path(str(outputs.checkpoint)), out_root

    single = run(1, 2)[0]
    one = read_manifest(single).metrics
    checkpoint, out_root = run(2, 1, FSDP2 if sharding == "fsdp" else None)
    two = read_manifest(checkpoint).metrics
    assert verify(checkpoint) == [] and (out_root / f"{checkpoint.name}.json").is_file()
    assert sorted(p.name for p in out_root.iterdir()) == [
        checkpoint.name,
        f"{checkpoint.name}.json",
    ]
    print(f"\ndpo losses, 1 rank x 2: {one['losses']}\n{sharding}, 2 ranks x 1: {two['losses']}")
    held_out_one, held_out_two = (m["held_out_after"]["loss"] for m in (one, two))
    print(f"dpo held-out loss after, 1 rank: {held_out_one}; 2 ranks: {held_out_two}")
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert one["losses"][-1] < one["losses"][0]  # it learns: the comparison is not vacuous
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    # the held-out pairs scored before training (policy = reference) and by the published model
    assert two["held_out_before"] == pytest.approx(one["held_out_before"], abs=1e-6)
    assert held_out_two == pytest.approx(held_out_one, rel=1e-4)
    weights_one, weights_two = (load_file(c / "model.safetensors") for c in (single, checkpoint))
    for name, tensor in weights_one.items():  # published whole (FSDP: gathered)
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=5e-5)


def rl_config(model: ModelConfig, **changes: Any) -> RLConfig:
    """A few GRPO iterations of the tiny model on MBPP problems, sampled with transformers."""
    settings: dict[str, Any] = {"iterations": 4, "prompts_per_iteration": 2, **changes}
    return RLConfig(
        model=model,
        problems=ProblemSet(limit=4),
        prompt_style="continuation",
        dynamic_sampling=False,
        sampling=SamplingConfig(num_generations=3, max_tokens=12),
        engine=EngineConfig(backend="hf"),
        scoring=SIGNAL,
        update=UpdateConfig(learning_rate=1e-2, sampler_is_cap=2.0),
        **settings,
    )


@pytest.mark.docker
def test_rl_on_two_ranks_with_an_engine_on_every_rank(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model")
    config = rl_config(model, samplers="every_rank", iterations=2, prompts_per_iteration=3)
    outputs, _ = launch(2, "rl", config, Artifacts(), tmp_path / "two")
    run_dir = Path(str(outputs.checkpoint)).parents[1]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:
        assert row["sampler/engines"] == 2  # rank 1 sampled its share, not the main process
        assert row["data/samples"] == 9 and row["data/groups_trained"] == 3
        assert row["sampler/refresh_probe_diff"] < 1e-5  # both engines serve the update
    scored = read_rows(run_dir / "rollouts" / "iteration-0001.parquet", ("prompt_id",))
    ids = [row["prompt_id"] for row in scored]
    assert len(set(ids)) == 3 and all(ids[i] == ids[i - i % 3] for i in range(9))  # in groups
    assert verify(Path(str(outputs.checkpoint))) == []


@pytest.mark.docker
@pytest.mark.parametrize("sharding", ["fsdp"])  # DDP's RL on two ranks: the test above
def test_an_rl_run_killed_on_two_ranks_resumes_on_one_and_on_two(
    tmp_path: Path, sharding: str
) -> None:
    """Killed on 2 ranks (DDP, or FSDP2 with its shards gathered into each checkpoint), then
    resumed on 1 process and on 2 as before: the trainer state is whole either way."""
    model = save_tiny_model(tmp_path / "model")
    config = rl_config(model, save_total_limit=None)  # every iteration kept, to check each
    lr = config.update.learning_rate
    fsdp = FSDP2 if sharding == "fsdp" else None
    killed = tmp_path / "killed"
    run = launched(2, "rl", config, Artifacts(), killed, fsdp)
    first_published = killed / "out"
    assert wait_until(
        lambda: (
            run.poll() is not None
            or any(first_published.glob("*/checkpoints/iteration-0001/manifest.json"))
        ),
        timeout=300,
    )
    assert run.poll() is None, run.communicate(timeout=600)[1][-3000:]
    kill_process_tree(run.pid)  # every rank, mid-run
    run.communicate()
    [out_dir] = [p for p in (killed / "out").iterdir() if p.is_dir()]
    published = last_published_iteration(out_dir)
    assert 1 <= published < 4 and not list((killed / "out").glob("*.json"))  # unfinished
    first = read_manifest(iteration_dir(out_dir, 1))
    before = load_file(iteration_dir(out_dir, 1) / "model.safetensors")
    shutil.copytree(killed, tmp_path / "again")

    finals = {}
    for processes, folder, setup in ((1, killed, None), (2, tmp_path / "again", fsdp)):
        outputs, out_root = launch(processes, "rl", config, Artifacts(), folder, setup)
        checkpoint = Path(str(outputs.checkpoint))
        assert checkpoint == out_root / out_dir.name / "checkpoints" / "iteration-0004"
        assert (out_root / f"{out_dir.name}.json").is_file()
        assert read_manifest(checkpoint.parent / "iteration-0001") == first  # kept, not redone
        assert all(verify(checkpoint.parent / f"iteration-{i:04d}") == [] for i in range(1, 5))
        rows = [
            json.loads(line)
            for line in (out_root / out_dir.name / "metrics.jsonl").read_text().splitlines()
        ]
        assert [row["iteration"] for row in rows] == [1, 2, 3, 4]
        assert all(row["sampler/engines"] == 1 for row in rows[published:])  # the main's
        finals[processes] = load_file(checkpoint / "model.safetensors")
    moved = max((finals[1][k] - before[k]).abs().max().item() for k in finals[1])
    diff = max((finals[1][k] - finals[2][k]).abs().max().item() for k in finals[1])
    print(f"\nrl, {sharding}, resumed after {published}: max |w(1) - w(2 ranks)| = {diff:.3g}")
    assert moved > 1e-3
    for name in finals[1]:
        torch.testing.assert_close(finals[2][name], finals[1][name], rtol=0, atol=0.05 * lr)
