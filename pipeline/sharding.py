"""Training under FSDP2 (accelerate's ``fully_shard``): whole weights and optimizer state
gathered for the checkpoint, and loaded back into the shards on resume.

A checkpoint holds whole tensors whatever trained it, in the layout one process writes
(``Optimizer.state_dict()``'s parameter indices), so a run saved on N sharded ranks resumes on
any number of processes, sharded or not. Gathering and loading use torch's
``torch.distributed.checkpoint.state_dict`` (full state dicts); each call is collective: every
rank calls it, and only the main process gets the tensors.

accelerate 1.15 turns FSDP on only on accelerators; on a CPU launch that asks for it
(``ACCELERATE_USE_FSDP``) :func:`make_accelerator` sets accelerate's state as accelerate
itself does on a GPU. torch's FSDP2 runs on the CPU over gloo, so the sharded path is tested
here without a GPU.
"""

from __future__ import annotations

import os
from typing import Any, cast

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .allocator import keep_freed_memory

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
LOAD = StateDictOptions(full_state_dict=True)
# A checkpoint merges a LoRA adapter into a copy of the model, which sharded weights are not.
LORA_REFUSED = "LoRA under FSDP is not supported: use DDP, or full fine-tuning"


def make_accelerator(mixed_precision: str) -> Accelerator:
    """The updater's accelerator: DDP, or FSDP2 when the launch asks for FSDP, on a CPU too.
    Every trainer starts here, so this is also where the process starts keeping the memory
    it frees (:func:`~.allocator.keep_freed_memory`)."""
    keep_freed_memory()
    accelerator = Accelerator(mixed_precision=mixed_precision)
    wants_fsdp = parse_flag_from_env("ACCELERATE_USE_FSDP")
    if wants_fsdp and accelerator.distributed_type == DistributedType.MULTI_CPU:
        # What AcceleratorState does for FSDP on an accelerator, done for the CPU.
        plugin = FullyShardedDataParallelPlugin()
        AcceleratorState._shared_state.update(
            distributed_type=DistributedType.FSDP, fsdp_plugin=plugin
        )
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ValueError(
            "FSDP version 1 is not supported by the policy update: set fsdp_version: 2 in the "
            f"accelerate config (FSDP_VERSION={os.environ.get('FSDP_VERSION')!r})"
        )
    return accelerator


def gather_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s whole state dict on the main process ({} on the others); collective."""
    return cast("dict[str, torch.Tensor]", get_model_state_dict(module, options=GATHER))


def load_model_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load whole tensors into ``module``'s shards; every rank passes the same ``state``."""
    set_model_state_dict(module, cast("dict[str, Any]", state), options=LOAD)


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters in its order: index ``i`` of
    ``Optimizer.state_dict()`` is ``names[i]`` in torch's named (full) state dicts."""
    name_of = {id(param): name for name, param in model.named_parameters()}
    return [name_of[id(param)] for group in optimizer.param_groups for param in group["params"]]


def gather_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state on the main process ({} on the others), numbered as
    ``Optimizer.state_dict()`` numbers it on one process; collective."""
    full = cast("dict[str, Any]", get_optimizer_state_dict(model, optimizer, options=GATHER))
    if not full:
        return {}
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return {
        "state": {index[name]: values for name, values in full["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in full["param_groups"]
        ],
    }


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a whole, index-numbered optimizer state (:func:`gather_optimizer_state`, or one
    process's ``Optimizer.state_dict()``) into the shards; every rank passes the same."""
    names = _parameter_names(model, optimizer)
    named = {
        "state": {names[i]: values for i, values in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, cast("Any", named), options=LOAD)
