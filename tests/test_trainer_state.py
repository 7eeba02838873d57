"""The RL trainer state: safetensors + JSON that round-trip the optimizer, critic, generator and
KL coefficient exactly; a pickle in a run folder (trainer state, model weights) is refused,
never unpickled."""

from __future__ import annotations

import errno
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from engines import saved_tiny_model
from safetensors import SafetensorError
from stage_helpers import rollout, write_rollouts
from update_cases import tiny_case, weights

from codepost.pipeline.atomic import WriteError
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish, write_model
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig
from codepost.pipeline.model_config import ModelNotFoundError, load_causal_lm, load_tokenizer
from codepost.pipeline.rl import trainer_state
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.rl.trainer_state import (
    PICKLED,
    SCALARS,
    TENSORS,
    TrainerState,
    gather_trainer_state,
    load_trainer_state,
)
from codepost.pipeline.stages.rl import (
    RLConfig,
    UpdateStageConfig,
    iteration_dir,
    run_rl,
    run_update,
)

CONFIGS = {
    "grpo": UpdateConfig(learning_rate=1e-2, minibatch_size=8, weight_decay=0.1),
    "ppo": UpdateConfig(
        algorithm="ppo",
        learning_rate=1e-2,
        critic_learning_rate=3e-3,
        epochs=2,
        minibatch_size=8,
        kl_in="reward",
        kl_coef=0.2,
        adaptive_kl_target=1e-6,
    ),
}


@pytest.mark.parametrize("algorithm", CONFIGS)
def test_saved_state_continues_training_exactly(algorithm, tmp_path):
    config = CONFIGS[algorithm]
    trained, batch = tiny_case(config)
    trained.update(batch)
    gather_trainer_state(trained, policy_version=1).save(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.*")) == [SCALARS, TENSORS]

    resumed, _ = tiny_case(config)
    resumed.policy.load_state_dict(trained.policy.state_dict())  # the checkpoint's weights
    if algorithm == "ppo":  # the critic comes from the trainer state alone
        fresh = weights(resumed)
        assert any(not torch.equal(fresh[n], v) for n, v in weights(trained).items())
    load_trainer_state(resumed, tmp_path)

    saved, loaded = trained.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert loaded["param_groups"] == saved["param_groups"]
    assert loaded["state"].keys() == saved["state"].keys()
    for index, state in saved["state"].items():
        assert loaded["state"][index].keys() == state.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert torch.equal(loaded["state"][index][key], value), (index, key)
    assert torch.equal(resumed.generator.get_state(), trained.generator.get_state())
    assert resumed.kl_controller.value == trained.kl_controller.value
    if algorithm == "ppo":
        assert trained.kl_controller.value != config.kl_coef  # the adaptive coefficient moved
    assert weights(resumed).keys() == weights(trained).keys()
    for name, value in weights(trained).items():
        assert torch.equal(weights(resumed)[name], value), name

    trained.update(batch)
    resumed.update(batch)
    for name, value in weights(trained).items():
        assert torch.equal(weights(resumed)[name], value), name


class _Payload:
    """Unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_a_pickled_trainer_state_in_a_run_folder_is_refused_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    control = tmp_path / "control.pt"
    torch.save({"optimizer": _Payload(marker)}, control)
    torch.load(control, weights_only=False)  # what the old loader did: the payload is live
    assert marker.is_file()
    marker.unlink()

    # A run whose published iteration 1 carries the payload as its trainer state.
    model = saved_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"

    def write(folder: Path) -> None:
        write_model(folder, load_causal_lm(model), load_tokenizer(model))
        torch.save({"optimizer": _Payload(marker)}, folder / PICKLED)

    first = iteration_dir(out, 1)
    manifest = CheckpointManifest(stage="rl-grpo", version="iteration-0001", parent=None)
    publish(first, write, manifest)

    config = RLConfig(
        model=model,
        problems=ProblemSet(limit=3),
        prompt_style="continuation",
        iterations=2,
        prompts_per_iteration=2,
        engine=EngineConfig(backend="hf"),
    )
    refused = re.escape(f"{first / PICKLED}: a pickled trainer state")
    with pytest.raises(ValueError, match=refused):
        run_rl(config, out)
    rows = tmp_path / "rows.parquet"
    write_rollouts(rows, [rollout("1", "pass", True, 1.0)])  # a row of the contract
    resumed_from = model.model_copy(update={"name_or_path": str(first)})
    with pytest.raises(ValueError, match=refused):
        run_update(UpdateStageConfig(model=resumed_from), rows, tmp_path / "update")
    assert not marker.exists()


def test_a_checkpoint_whose_weights_are_a_pickle_is_refused_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    model = saved_tiny_model(tmp_path / "tiny")
    folder = Path(model.name_or_path)
    (folder / "model.safetensors").unlink()
    torch.save({"model.norm.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(ModelNotFoundError, match=r"no file named model\.safetensors"):
        load_causal_lm(model)
    assert not marker.exists()


def test_a_full_disk_at_the_trainer_state_save_names_the_file(tmp_path, monkeypatch):
    """safetensors reports ENOSPC in its own error, and the partial file is removed before the
    error is read, so the disk no longer looks full: the message must still name the file.
    (A real full tmpfs: ``tests/test_atomic.py``; here the disk has room after the removal.)"""

    def fills_the_disk(tensors: dict, path: str | os.PathLike) -> None:
        Path(path).write_bytes(b"\0" * 4096)  # what was written before the disk filled up
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(trainer_state, "save_file", fills_the_disk)
    state = TrainerState({"generator": torch.zeros(8)}, {"format": 1})
    with pytest.raises(WriteError) as caught:
        state.save(tmp_path / "iteration-0001")
    assert caught.value.errno == errno.ENOSPC
    target = tmp_path / "iteration-0001" / TENSORS
    assert f"No space left on device (writing {target}: Error while" in str(caught.value)
    assert not list(target.parent.iterdir())  # the partial file is gone
