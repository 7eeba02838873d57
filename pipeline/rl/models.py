"""Model pieces of the RL update: the critic, and the policy and critic as one module."""

from __future__ import annotations

import copy

from torch import Tensor, nn
from transformers import PreTrainedModel

from ..logprobs import ModelInputs, completion_logits


class ValueModel(nn.Module):
    """Critic ``V(s_t)``: a transformer backbone plus a scalar head on its last hidden state.

    ``V(s_t)`` is read at the position that predicts completion token ``t`` (the state before
    emitting it), the same positions :func:`completion_logits` uses.
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(
            backbone.config.get_text_config().hidden_size, 1, dtype=backbone.dtype
        )
        # Zero start: the first advantages are the plain returns, not the noise of a random head.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: PreTrainedModel) -> ValueModel:
        """A critic whose backbone is a copy of the policy's (the usual PPO initialisation).
        Build it before any LoRA wrapping, or the copy carries the adapters."""
        return cls(copy.deepcopy(policy.get_decoder()))

    def forward(self, inputs: ModelInputs) -> Tensor:
        num_tokens = inputs.completion_ids.shape[1]
        hidden = self.backbone(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
        ).last_hidden_state[:, -num_tokens - 1 : -1]
        return self.head(hidden).squeeze(-1).float()


class ActorCritic(nn.Module):
    """Policy and optional critic as one module, so DDP/FSDP wrap, sync and reduce them together
    (one ``no_sync``, one backward for the joint PPO loss)."""

    def __init__(self, policy: nn.Module, critic: ValueModel | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.critic = critic

    def forward(self, inputs: ModelInputs) -> tuple[Tensor, Tensor | None]:
        logits = completion_logits(self.policy, inputs)
        values = self.critic(inputs) if self.critic is not None else None
        return logits, values


def disable_dropout(module: nn.Module) -> None:
    """Zero every dropout: with dropout on, the first PPO ratio is not 1 and old logprobs drift."""
    for submodule in module.modules():
        if isinstance(submodule, nn.Dropout):
            submodule.p = 0.0
