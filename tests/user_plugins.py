"""A user's own reward term, advantage estimator and policy loss, as a package outside codepost
would hold them: the plug-in tests name them by import path (``user_plugins:...``)."""

from __future__ import annotations

from typing import Any

import torch

from codepost.pipeline.rl.algorithms import AdvantageInputs, LossInputs
from codepost.verifiers import Program

CALLS = {"loss": 0}  # how often the loss ran in this process


def defines_a_function(completion: str, program: Program, length: int, *, bonus: float) -> float:
    """``bonus`` for a program that defines a function at all."""
    return bonus if "def " in program.source else 0.0


def centred_scores(inputs: AdvantageInputs, *, scale: float) -> tuple[Any, Any]:
    """``scale`` x (the row's score - its group's mean), on every response token."""
    scores = (inputs.token_rewards * inputs.response_mask).sum(-1)
    _, inverse = torch.unique(inputs.group_ids, return_inverse=True)
    means = scores.new_zeros(int(inverse.max()) + 1).index_add_(0, inverse, scores)
    means /= torch.bincount(inverse).to(scores.dtype)
    advantages = scale * (scores - means[inverse])[:, None] * inputs.response_mask
    return advantages, advantages


def policy_gradient(inputs: LossInputs, *, coef: float) -> tuple[Any, dict[str, Any]]:
    """REINFORCE's ``-A log pi``, scaled by ``coef``."""
    CALLS["loss"] += 1
    per_token = -coef * inputs.advantages * inputs.logprobs
    return inputs.aggregate(per_token), {"user_pg": per_token.detach().mean()}
