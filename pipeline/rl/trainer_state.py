"""The trainer state an RL checkpoint carries so that training continues exactly where it
stopped: the optimizer's moments and step counts, the critic (PPO), the generator that shuffles
minibatches and the KL coefficient.

Tensors go to ``trainer_state/tensors.safetensors`` under stable names
(``optimizer.state.<param index>.exp_avg``, ``critic.<parameter>``, ``generator``); the rest
(param-group hyperparameters, scalars) to ``trainer_state/scalars.json``. A folder of its own,
as vLLM and the sampler's refresh load every ``*.safetensors`` beside ``config.json`` as model
weights. Reading either file never runs code, so a run folder someone sent is safe to resume
from. A pickled ``trainer_state.pt``, which earlier versions wrote, is refused, never unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import Tensor

from ..atomic import staged, write_json
from ..checkpoints.manifest import STATE
from ..sharding import (
    gather_model_state,
    gather_optimizer_state,
    load_model_state,
    load_optimizer_state,
)
from .policy_update import PolicyUpdater

TENSORS = f"{STATE}/tensors.safetensors"
SCALARS = f"{STATE}/scalars.json"
PICKLED = "trainer_state.pt"
FORMAT = 1


@dataclass
class TrainerState:
    """A trainer state gathered whole, ready to write (on the main process)."""

    tensors: dict[str, Tensor]
    scalars: dict[str, Any]

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        with staged(folder / TENSORS) as staging:
            save_file({n: t.detach().contiguous() for n, t in self.tensors.items()}, staging)
        write_json(folder / SCALARS, self.scalars)


def gather_policy_weights(updater: PolicyUpdater) -> dict[str, Tensor] | None:
    """The policy's whole weights when sharded, collective under FSDP (every rank calls it);
    None: the policy module holds them."""
    return gather_model_state(updater.policy) if updater.sharded else None


def gather_trainer_state(updater: PolicyUpdater, *, policy_version: int) -> TrainerState:
    """``updater``'s whole state. Collective under FSDP (every rank calls it; only the main
    process's result holds the sharded tensors)."""
    if updater.sharded:
        optimizer = gather_optimizer_state(updater.actor_critic, updater.optimizer)
    else:
        optimizer = updater.optimizer.state_dict()
    tensors: dict[str, Tensor] = {"generator": updater.generator.get_state()}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in optimizer.get("state", {}).items():
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.state.{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    critic = updater.critic
    if critic is not None:
        weights = gather_model_state(critic) if updater.sharded else critic.state_dict()
        tensors.update({f"critic.{k}": v for k, v in weights.items()})
    return TrainerState(
        tensors,
        {
            "format": FORMAT,
            "policy_version": policy_version,
            "kl_coef": updater.kl_controller.value,
            "optimizer": {"param_groups": optimizer.get("param_groups"), "state": scalars},
        },
    )


def has_trainer_state(folder: Path) -> bool:
    """Whether ``folder`` holds a trainer state to continue from. Raises when it holds only a
    pickled one: unpickling a file from a run folder can run any code."""
    folder = Path(folder)
    if (folder / TENSORS).is_file():
        return True
    if (folder / PICKLED).exists():
        raise ValueError(
            f"{folder / PICKLED}: a pickled trainer state (an earlier codepost version wrote "
            f"it); it is not loaded, since unpickling can run arbitrary code. Resume from a "
            f"checkpoint with {TENSORS} and {SCALARS}, or start the run in a new folder."
        )
    return False


def load_trainer_state(updater: PolicyUpdater, folder: Path) -> None:
    """Continue ``updater`` from the state saved in ``folder`` (:meth:`TrainerState.save`)."""
    folder = Path(folder)
    if not has_trainer_state(folder):
        raise FileNotFoundError(
            f"{folder}: no trainer state ({TENSORS}) to resume from: an RL iteration keeps it "
            "until a newer one is published"
        )
    tensors = load_file(folder / TENSORS)
    scalars = json.loads((folder / SCALARS).read_text())
    if scalars.get("format") != FORMAT:
        raise ValueError(f"{folder / SCALARS}: format {scalars.get('format')!r}, not {FORMAT}")
    saved = scalars["optimizer"]
    state = {int(index): dict(values) for index, values in saved["state"].items()}
    critic: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name.startswith("optimizer.state."):
            index, key = name.removeprefix("optimizer.state.").split(".", 1)
            state.setdefault(int(index), {})[key] = tensor
        elif name.startswith("critic."):
            critic[name.removeprefix("critic.")] = tensor
        elif name != "generator":
            raise ValueError(f"{folder / TENSORS}: unexpected tensor {name!r}")
    # JSON has no tuples: give back those the optimizer's defaults have (AdamW's betas).
    defaults = updater.optimizer.defaults
    groups = [
        {k: tuple(v) if isinstance(defaults.get(k), tuple) else v for k, v in group.items()}
        for group in saved["param_groups"]
    ]
    optimizer = {"state": state, "param_groups": groups}
    if updater.sharded:
        load_optimizer_state(updater.actor_critic, updater.optimizer, optimizer)
    else:
        updater.optimizer.load_state_dict(optimizer)
    updater.kl_controller.value = scalars["kl_coef"]
    updater.generator.set_state(tensors["generator"])
    if critic and updater.critic is not None:
        if updater.sharded:
            load_model_state(updater.critic, critic)
        else:
            updater.critic.load_state_dict(critic)
