"""RL algorithms as small, pure tensor functions over masks (verl ``core_algos.py`` style).

Shapes: ``[B, T]`` is batch x response tokens; masks are float 1/0 with the same shape and are
built from lengths, never from pad ids. Nothing here knows about models, tokenizers or devices,
so every function is testable on a handful of numbers.

Loss normalisation: :func:`aggregate_loss` divides by counts that the caller passes for the
whole minibatch (all micro-batches, all data-parallel ranks). Summing the gradients of the
micro-batch losses then gives exactly the full-batch gradient, whatever the split.

Three registries: :data:`ADVANTAGE_ESTIMATORS` and :data:`POLICY_LOSSES` hold functions, each
with a pydantic model of its own hyperparameters (named by its ``name``, so a config picks one
by name: :func:`registered_params`); each function takes the batch as one object
(:class:`AdvantageInputs`, :class:`LossInputs`), so one that needs more of the batch reads it
there. :data:`ALGORITHMS` holds the named recipes users know (``grpo``, ``dr_grpo``, ``dapo``,
``rloo``, ``reinforce++``, ``a2c``, ``ppo``): an estimator and a loss with their
hyperparameters, and the update settings their papers use. Adding an algorithm is a
registration here; the trainer asks the registries, never an algorithm's name.

torch loads in the functions that compute, not with the module: a run's config (the
hyperparameter models and the registries) is read, and its flags refused, without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializeAsAny,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ...settings.registry import Registry
from ...verifiers.plugins import Plugin

if TYPE_CHECKING:
    from torch import Tensor


# exp(20) is already far outside any clip range; beyond it float32 overflows to inf.
_MAX_LOG_RATIO = 20.0

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence")


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def _check_2d(name: str, t: Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be [batch, tokens], got shape {tuple(t.shape)}")


# --------------------------------------------------------------------------------------------
# Masks and reductions
# --------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x * mask``; masked positions contribute 0 even when they hold inf or NaN."""
    import torch

    weighted = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))
    return weighted.sum() if dim is None else weighted.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over the masked positions; an empty mask gives 0 rather than NaN."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked positions (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(f"unbiased masked_var needs at least 2 valid entries, got {count}")
        var = var * count / (count - 1)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise to zero mean and unit variance over the masked positions; 0 outside the mask.

    With ``shift_mean=False`` only the scale changes (the mean is kept), as in TRL.
    """
    import torch

    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask != 0, whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def response_mask_from_lengths(lengths: Tensor, max_len: int) -> Tensor:
    """``[B, max_len]`` float mask with the first ``lengths[i]`` tokens of row ``i`` valid.

    Built from lengths because pad ids are unreliable: many tokenizers pad with the EOS id, so
    a mask from ``ids != pad_id`` drops the real EOS token the model must learn to emit.
    """
    import torch

    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D integer tensor, got {lengths.dtype} {tuple(lengths.shape)}"
        )
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).float()


def outcome_to_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Put each sequence's scalar score on its last valid token (0 everywhere else)."""
    import torch

    _check_2d("response_mask", response_mask)
    if scores.shape != response_mask.shape[:1]:
        raise ValueError(
            f"scores must be [batch={response_mask.shape[0]}], got {tuple(scores.shape)}"
        )
    if (response_mask.sum(-1) == 0).any():
        raise ValueError("every response needs at least one valid token to carry its score")
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)
    last = ((response_mask != 0) * positions).argmax(-1)
    dtype = torch.result_type(scores, response_mask)
    rewards = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
    return rewards.scatter_(1, last[:, None], scores[:, None].to(dtype))


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_{t+1}`` over valid tokens; 0 outside the mask.

    Masked positions inside a sequence (e.g. tool output) are skipped: they neither add reward
    nor discount.
    """
    import torch

    _check_2d("token_rewards", token_rewards)
    _check_same_shape(token_rewards=token_rewards, response_mask=response_mask)
    valid = response_mask != 0
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, 0.0)
    return returns


# --------------------------------------------------------------------------------------------
# Registries
# --------------------------------------------------------------------------------------------


class Hyperparameters(BaseModel):
    """Base of each estimator's and loss's own settings: a new hyperparameter is a field of the
    one model that uses it, not a keyword every function has to accept and ignore. ``name`` is
    the registered name (each model narrows it to a ``Literal``), and always part of a dump, so
    that a dump, even of the fields set only, says whose settings these are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str

    @property
    def bounds_step(self) -> bool:
        """Whether a loss with these settings bounds a step away from the samples' policy (a
        clip), so that several epochs and minibatches may reuse one batch."""
        return False

    def model_post_init(self, context: Any) -> None:
        self.__pydantic_fields_set__.add("name")


@dataclass(frozen=True)
class _Entry:
    """A registered function with the model of its hyperparameters."""

    params: type[Hyperparameters]

    def _params(self, params: Hyperparameters | None) -> Hyperparameters:
        if params is None:
            return self.params.model_validate({})
        if not isinstance(params, self.params):
            raise TypeError(f"expected {self.params.__name__}, got {type(params).__name__}")
        return params


def _registered_name(params: type[Hyperparameters]) -> str:
    """The name a params model registers under: the default of its ``name`` field."""
    name = params.model_fields["name"].default
    if not isinstance(name, str):
        raise TypeError(f"{params.__name__} needs a `name: Literal[...]` field with its name")
    return name


@dataclass(frozen=True)
class _RegistryChoice:
    """The hyperparameters of one entry of ``registry``, picked by their ``name`` when the
    config is validated (so an entry registered after the config class still validates); the
    JSON schema (the Prefect form) offers every entry registered by then."""

    registry: Registry[Any]

    def validate(self, value: Any) -> Any:
        if isinstance(value, Hyperparameters):
            return value
        kind = self.registry.kind
        if isinstance(value, str):
            raise ValueError(f"give the {kind} as a mapping with its name: {{name: {value}}}")
        if not isinstance(value, Mapping) or "name" not in value:
            raise ValueError(f"a {kind} needs its `name`, one of {sorted(self.registry)}")
        return self.registry[value["name"]].params.model_validate(value)

    def member(self, name: str) -> type[Hyperparameters]:
        """The params model registered as ``name``."""
        return self.registry[name].params

    def members(self) -> list[type[Hyperparameters]]:
        return [entry.params for entry in self.registry.values()]

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        members = [entry.params.__pydantic_core_schema__ for entry in self.registry.values()]
        return {"oneOf": [handler(m) for m in members], "discriminator": {"propertyName": "name"}}


def registered_params(registry: Registry[Any]) -> Any:
    """The type of a config field holding the hyperparameters of one entry of ``registry``,
    e.g. ``{name: gae, lam: 0.95}``."""
    choice = _RegistryChoice(registry)
    return Annotated[SerializeAsAny[Hyperparameters], BeforeValidator(choice.validate), choice]


# --------------------------------------------------------------------------------------------
# Advantage estimators
# --------------------------------------------------------------------------------------------


def _columns(columns: Mapping[str, Tensor], name: str) -> Tensor:
    if name not in columns:
        raise ValueError(f"the rollouts have no column {name!r} (they have: {sorted(columns)})")
    return columns[name]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator reads of a batch: ``[B, T]`` token tensors, ``[B]`` per row."""

    token_rewards: Tensor  # the outcome on each response's last token (minus a KL penalty)
    response_mask: Tensor
    group_ids: Tensor | None = None  # one id per prompt
    values: Tensor | None = None  # the critic's
    # Every numeric column of the rollout rows (pass_fraction, reward_<term>, ...): a new
    # estimator reads what it needs here, and nothing else changes.
    columns: Mapping[str, Tensor] = field(default_factory=dict)

    def column(self, name: str) -> Tensor:
        """The per-row values of the rollouts' column ``name``, ``[B]``."""
        return _columns(self.columns, name)


class AdvantageFn(Protocol):
    """The batch as one object; hyperparameters in the estimator's own ``params`` model."""

    def __call__(self, inputs: AdvantageInputs, params: Any) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class AdvantageEstimator(_Entry):
    """``inputs -> (advantages, returns)``, both ``[B, T]`` and 0 off the mask. ``needs_critic``:
    it reads the critic's values; ``min_group_size``: the completions per prompt it needs."""

    fn: AdvantageFn
    needs_critic: bool = False
    min_group_size: int = 1

    def __call__(
        self, inputs: AdvantageInputs, params: Hyperparameters | None = None
    ) -> tuple[Tensor, Tensor]:
        """The estimate with ``params`` (None: the estimator's defaults)."""
        _check_2d("token_rewards", inputs.token_rewards)
        _check_same_shape(token_rewards=inputs.token_rewards, response_mask=inputs.response_mask)
        return self.fn(inputs, self._params(params))


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
AdvantageParams = registered_params(ADVANTAGE_ESTIMATORS)


def register_advantage(
    params: type[Hyperparameters], *, needs_critic: bool = False, min_group_size: int = 1
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator, with the model of its hyperparameters, under the name
    that model carries. It computes without autograd: advantages and returns are targets,
    never differentiated (the critic learns from its own value loss)."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        @functools.wraps(fn)
        def without_grad(inputs: AdvantageInputs, params: Any) -> tuple[Tensor, Tensor]:
            import torch

            with torch.no_grad():
                return fn(inputs, params)

        entry = AdvantageEstimator(params, without_grad, needs_critic, min_group_size)
        ADVANTAGE_ESTIMATORS.register(_registered_name(params), entry)
        return without_grad

    return decorator


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    return ADVANTAGE_ESTIMATORS[name]


def _sequence_scores(inputs: AdvantageInputs) -> Tensor:
    return masked_sum(inputs.token_rewards, inputs.response_mask, dim=-1)


def _group_stats(
    scores: Tensor, group_ids: Tensor | None, estimator: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: its group's mean, population variance and size."""
    import torch

    if group_ids is None:
        raise ValueError(f"advantage estimator {estimator!r} needs group_ids")
    if group_ids.shape != scores.shape or group_ids.is_floating_point():
        raise ValueError(
            f"group_ids must be an integer tensor of shape {tuple(scores.shape)}, "
            f"got {group_ids.dtype} {tuple(group_ids.shape)}"
        )
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sizes = counts.to(scores.dtype)
    mean = scores.new_zeros(len(counts)).index_add_(0, inverse, scores) / sizes
    centred = scores - mean[inverse]
    var = scores.new_zeros(len(counts)).index_add_(0, inverse, centred**2) / sizes
    return mean[inverse], var[inverse], counts[inverse]


class GRPOParams(Hyperparameters):
    name: Literal["grpo"] = "grpo"
    norm_by_std: bool = Field(True, description="False is Dr.GRPO: mean-centred scores only")
    eps: float = Field(1e-6, gt=0, description="added to the group std")


@register_advantage(GRPOParams)
def grpo_advantages(inputs: AdvantageInputs, params: GRPOParams) -> tuple[Tensor, Tensor]:
    """GRPO: z-score of each sequence score within its prompt group, on every valid token.

    The std is the population std (1/G), as in the GRPO formula. ``norm_by_std=False`` is
    Dr.GRPO: dividing by the std over-weights near-uniform groups (too easy or too hard).
    A group of one gets advantage 0. Returns are the (undiscounted) return-to-go.
    """
    scores = _sequence_scores(inputs)
    mean, var, _ = _group_stats(scores, inputs.group_ids, "grpo")
    advantages = scores - mean
    if params.norm_by_std:
        advantages = advantages / (var.sqrt() + params.eps)
    return _on_tokens(advantages, inputs), _returns(inputs)


def _on_tokens(advantages: Tensor, inputs: AdvantageInputs) -> Tensor:
    """A per-sequence advantage on every valid token of its sequence."""
    return advantages[:, None] * inputs.response_mask


def _returns(inputs: AdvantageInputs, gamma: float = 1.0) -> Tensor:
    return discounted_returns(inputs.token_rewards, inputs.response_mask, gamma)


class RLOOParams(Hyperparameters):
    name: Literal["rloo"] = "rloo"


@register_advantage(RLOOParams, min_group_size=2)
def rloo_advantages(inputs: AdvantageInputs, params: RLOOParams) -> tuple[Tensor, Tensor]:
    """RLOO: score minus the mean score of the other samples of the same prompt.

    The baseline excludes the sample itself, so the estimate stays unbiased; it equals
    ``n/(n-1) * (score - group mean)``. Needs at least 2 samples per group. No hyperparameters.
    """
    scores = _sequence_scores(inputs)
    mean, _, sizes = _group_stats(scores, inputs.group_ids, "rloo")
    if (sizes < 2).any():
        raise ValueError("rloo needs at least 2 samples in every group (leave-one-out baseline)")
    n = sizes.to(scores.dtype)
    advantages = n / (n - 1) * (scores - mean)
    return _on_tokens(advantages, inputs), _returns(inputs)


class ReinforcePPParams(Hyperparameters):
    name: Literal["reinforce++"] = "reinforce++"
    gamma: float = Field(1.0, ge=0, le=1, description="discount of the return-to-go")
    eps: float = Field(1e-6, gt=0, description="added to the batch variance when whitening")


@register_advantage(ReinforcePPParams)
def reinforce_pp_advantages(
    inputs: AdvantageInputs, params: ReinforcePPParams
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the whole batch.

    Global (not per-group) normalisation: its bias vanishes as the batch grows.
    """
    returns = _returns(inputs, params.gamma)
    return masked_whiten(returns, inputs.response_mask, eps=params.eps), returns


class ReinforcePPBaselineParams(Hyperparameters):
    name: Literal["reinforce++_baseline"] = "reinforce++_baseline"
    eps: float = Field(1e-6, gt=0, description="added to the batch variance when whitening")


@register_advantage(ReinforcePPBaselineParams)
def reinforce_pp_baseline_advantages(
    inputs: AdvantageInputs, params: ReinforcePPBaselineParams
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: score minus group mean, then global whitening.

    The group mean removes the prompt's difficulty; the global scale keeps near-uniform groups
    from being blown up the way a per-group std would.
    """
    scores = _sequence_scores(inputs)
    mean, _, _ = _group_stats(scores, inputs.group_ids, "reinforce++_baseline")
    centred = _on_tokens(scores - mean, inputs)
    return masked_whiten(centred, inputs.response_mask, eps=params.eps), _returns(inputs)


class GAEParams(Hyperparameters):
    name: Literal["gae"] = "gae"
    gamma: float = Field(1.0, ge=0, le=1, description="discount")
    lam: float = Field(1.0, ge=0, le=1, description="0: one-step TD; 1: return minus value")
    whiten: bool = Field(False, description="whiten the advantages over the batch (PPO's habit)")


@register_advantage(GAEParams, needs_critic=True)
def gae_advantages(inputs: AdvantageInputs, params: GAEParams) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation: ``A_t = sum_l (gamma*lam)^l delta_{t+l}``.

    ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V`` = 0 after the last valid token.
    Returns are ``A + V`` (the critic's target), taken before any whitening. Masked positions
    inside a sequence are skipped, like in :func:`discounted_returns`.
    """
    import torch

    token_rewards, response_mask, values = inputs.token_rewards, inputs.response_mask, inputs.values
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values from a critic")
    _check_same_shape(token_rewards=token_rewards, values=values)
    gamma, lam = params.gamma, params.lam
    valid = response_mask != 0
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_advantage = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        advantages[:, t] = torch.where(valid[:, t], advantage, 0.0)
    returns = torch.where(valid, advantages + values, 0.0)
    if params.whiten:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


class CustomAdvantageParams(Plugin, Hyperparameters):
    """A user's own estimator by import path, ``fn(inputs: AdvantageInputs, **kwargs) ->
    (advantages, returns)``: no critic, one completion per prompt at least."""

    name: Literal["custom"] = "custom"

    def arguments(self) -> int:
        return 1


@register_advantage(CustomAdvantageParams)
def custom_advantage(
    inputs: AdvantageInputs, params: CustomAdvantageParams
) -> tuple[Tensor, Tensor]:
    return params.function(inputs, **params.kwargs)


# --------------------------------------------------------------------------------------------
# KL to the reference policy
# --------------------------------------------------------------------------------------------


K3_MAX_LOG_RATIO = 20.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || ref) for tokens sampled from pi (Schulman's k1/k2/k3).

    k1 = log(pi/ref): unbiased, can be negative. k2 = 0.5 log(pi/ref)^2: biased, >= 0.
    k3 = r - 1 - log r with r = ref/pi: unbiased and >= 0. Subtract ``coef * kl`` from the
    token rewards (PPO style) or aggregate it into the loss (GRPO style).
    """
    import torch

    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        # expm1(x) - x is exactly >= 0 in floating point, unlike exp(x) - x - 1 near x = 0. The
        # exponent is clamped (verl's low_var_kl clamps it at 20 too): at a padded position the
        # log ratio can be anything, expm1 overflows past ~88.7, and a mask multiplying inf
        # still makes the gradient NaN.
        log_ratio = log_ratio.clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {list(KL_ESTIMATORS)}")


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op, so both controllers can be driven the same way."""


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl``.

    Ziegler et al. 2019: ``coef *= 1 + clip(kl/target - 1, -0.2, 0.2) * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(
                "need init_kl_coef >= 0, target_kl > 0 and horizon > 0, got "
                f"{init_kl_coef}, {target_kl}, {horizon}"
            )
        self.value = init_kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------


def _positive_count(name: str, count: float | None, local: Tensor) -> Tensor | float:
    if count is None:
        return local.clamp(min=1)
    if count <= 0:
        raise ValueError(f"{name} must be positive, got {count}")
    return count


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar.

    ``num_tokens`` / ``num_seqs`` are the counts of the whole minibatch (all micro-batches and
    data-parallel ranks). With them each micro-batch returns its share of the full-batch loss,
    so summed gradients match the full batch exactly. ``None`` uses the local counts. A
    sequence counts only if it has at least one valid token.

    - ``token-mean``: every token weighs the same (DAPO); long answers weigh more.
    - ``seq-mean-token-sum``: sum over a sequence's tokens, mean over sequences (Dr.GRPO style,
      with a constant normaliser).
    - ``seq-mean-token-mean``: mean within each sequence, then over sequences (original GRPO).
    """
    _check_2d("loss_mat", loss_mat)
    _check_same_shape(loss_mat=loss_mat, mask=mask)
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / _positive_count("num_tokens", num_tokens, mask.sum())
    local_seqs = (mask.sum(-1) > 0).sum().to(loss_mat.dtype)
    seqs = _positive_count("num_seqs", num_seqs, local_seqs)
    if mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, mask, dim=-1).sum() / seqs
    if mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, mask, dim=-1).sum() / seqs
    raise ValueError(f"unknown loss aggregation mode {mode!r}; known: {list(AGG_MODES)}")


def approx_kl(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(old || new) over the masked tokens (sampled from the old policy)."""
    return masked_mean(kl_penalty(old_logprobs, logprobs, "k3"), mask)


def truncated_is_weights(
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    cap: float,
    beyond_cap: Literal["truncate", "drop"] = "truncate",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level importance weights ``pi_old / pi_sampler``, truncated to ``cap`` or, with
    ``beyond_cap="drop"``, 0 past it (AReaL's ``behav_imp_weight_cap``).

    The sampler (vLLM kernels, bf16, a stale refresh, or weights versions behind in the
    asynchronous loop) and the trainer disagree, so its rollouts are off-policy; weighing each
    token by this ratio corrects it, and the cap bounds the variance (TRL's
    ``vllm_importance_sampling_correction``, verl's ``rollout_correction``). Positions without a
    sampling logprob (NaN) weigh 1. ``is_truncated_fraction`` is the share of tokens past the
    cap, truncated or dropped.
    """
    import torch

    _check_same_shape(old_logprobs=old_logprobs, sampling_logprobs=sampling_logprobs, mask=mask)
    valid = (mask != 0) & ~torch.isnan(sampling_logprobs)
    log_ratio = torch.where(valid, old_logprobs - sampling_logprobs, 0.0)
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    if beyond_cap == "truncate":
        weights = ratio.clamp(max=cap)
    elif beyond_cap == "drop":
        weights = torch.where(ratio > cap, 0.0, ratio)
    else:
        raise ValueError(f"beyond_cap={beyond_cap!r}: truncate or drop")
    metrics = {
        "is_weight_mean": masked_mean(weights, valid.float()),
        "is_ratio_max": torch.where(valid, ratio, 0.0).max(),
        "is_truncated_fraction": masked_mean((ratio > cap).float(), valid.float()),
    }
    return weights, metrics


def importance_log_ratio(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, level: str
) -> Tensor:
    """``log(pi / pi_old)`` per token, or per sequence (the mean over its valid tokens, ``[B, 1]``,
    GSPO's length-normalised sequence ratio). Gradients flow through every token."""
    log_ratio = logprobs - old_logprobs
    if level == "sequence":
        return masked_mean(log_ratio, mask, dim=-1)[:, None]
    if level != "token":
        raise ValueError(f"unknown ratio level {level!r}; known: {list(RATIO_LEVELS)}")
    return log_ratio


@dataclass(frozen=True)
class LossInputs:
    """What a policy loss reads of a micro-batch: ``[B, T]`` token tensors, and how to reduce
    them to the micro-batch's share of the whole minibatch's loss (:meth:`aggregate`)."""

    logprobs: Tensor  # the policy's, with gradients
    old_logprobs: Tensor  # the policy's before this update's steps
    advantages: Tensor
    response_mask: Tensor  # the tokens that train
    agg_mode: str = "token-mean"
    num_tokens: float | None = None  # of the whole minibatch (every micro-batch and rank)
    num_seqs: float | None = None
    # Every numeric column of the rollout rows, ``[B]``: see :class:`AdvantageInputs`.
    columns: Mapping[str, Tensor] = field(default_factory=dict)
    # The sampler's logprobs of the same tokens (the behaviour policy; NaN where it kept none)
    behaviour_logprobs: Tensor | None = None

    def aggregate(self, per_token: Tensor) -> Tensor:
        """``per_token`` reduced as :func:`aggregate_loss` does, over the response mask."""
        return aggregate_loss(
            per_token,
            self.response_mask,
            self.agg_mode,
            num_tokens=self.num_tokens,
            num_seqs=self.num_seqs,
        )

    def column(self, name: str) -> Tensor:
        return _columns(self.columns, name)


class PolicyLossFn(Protocol):
    """The micro-batch as one object and the loss's own ``params``; returns the loss to minimise
    and detached metrics local to this micro-batch."""

    def __call__(self, inputs: LossInputs, params: Any) -> tuple[Tensor, dict[str, Tensor]]: ...


@dataclass(frozen=True)
class PolicyLoss(_Entry):
    """A policy loss; ``ratio_level`` is the importance ratio it uses, which the ratio-weighted
    KL to the reference uses too; ``behaviour_weighted``: it weighs each token by
    ``pi_old / pi_sampler`` itself (off-policy rows need no other correction)."""

    fn: PolicyLossFn
    ratio_level: str = "token"
    behaviour_weighted: bool = False

    def __call__(
        self, inputs: LossInputs, params: Hyperparameters | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss with ``params`` (None: the loss's defaults)."""
        _check_2d("logprobs", inputs.logprobs)
        _check_same_shape(
            logprobs=inputs.logprobs,
            old_logprobs=inputs.old_logprobs,
            advantages=inputs.advantages,
            response_mask=inputs.response_mask,
        )
        return self.fn(inputs, self._params(params))


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
PolicyLossParams = registered_params(POLICY_LOSSES)


def register_policy_loss(
    params: type[Hyperparameters], *, ratio_level: str = "token", behaviour_weighted: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a policy loss, with the model of its hyperparameters, under the name
    that model carries."""
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {ratio_level!r}; known: {list(RATIO_LEVELS)}")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        entry = PolicyLoss(params, fn, ratio_level, behaviour_weighted)
        POLICY_LOSSES.register(_registered_name(params), entry)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES[name]


class ClipParams(Hyperparameters):
    """PPO's trust region on the importance ratio."""

    clip_low: float = Field(0.2, ge=0, lt=1, description="the ratio's floor is 1 - clip_low")
    clip_high: float = Field(
        0.2, ge=0, le=10, description="the ratio's ceiling is 1 + clip_high; 0.28 is DAPO's"
    )
    dual_clip: float | None = Field(
        None, gt=1, description="cap the loss of negative-advantage tokens at -c * A; None = off"
    )

    @property
    def bounds_step(self) -> bool:
        return True


def _clipped_surrogate(
    log_ratio: Tensor, inputs: LossInputs, params: ClipParams, weights: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate for a given log-ratio, each token's loss times its ``weights``
    (none: 1); the losses differ only in the ratio and the weights."""
    import torch

    advantages, mask = inputs.advantages, inputs.response_mask
    clip_low, clip_high = params.clip_low, params.clip_high
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    if params.dual_clip is not None:
        capped = torch.minimum(losses, -advantages * params.dual_clip)
        losses = torch.where(advantages < 0, capped, losses)
    loss = inputs.aggregate(losses if weights is None else losses * weights)

    with torch.no_grad():
        metrics = {
            "clipfrac_low": masked_mean(
                ((advantages < 0) & (ratio < 1 - clip_low)).to(ratio.dtype), mask
            ),
            "clipfrac_high": masked_mean(
                ((advantages > 0) & (ratio > 1 + clip_high)).to(ratio.dtype), mask
            ),
            "approx_kl": approx_kl(inputs.logprobs, inputs.old_logprobs, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


class VanillaParams(ClipParams):
    name: Literal["vanilla"] = "vanilla"


@register_policy_loss(VanillaParams)
def vanilla_policy_loss(
    inputs: LossInputs, params: VanillaParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with a per-token ratio, clip-higher and optional dual clip.

    The ratio is clipped to ``[1 - clip_low, 1 + clip_high]``; a larger ``clip_high`` (DAPO)
    lets unlikely tokens grow, which keeps entropy from collapsing. ``dual_clip = c > 1`` caps
    the loss of negative-advantage tokens at ``-c * A``, so a huge ratio on a bad token cannot
    dominate the batch.

    Metrics: ``clipfrac_low`` / ``clipfrac_high`` are the fractions of tokens whose gradient
    the lower / upper clip removed; ``approx_kl`` is KL(old || new); ``ratio_mean`` is the mean
    ratio used.
    """
    log_ratio = importance_log_ratio(
        inputs.logprobs, inputs.old_logprobs, inputs.response_mask, "token"
    )
    return _clipped_surrogate(log_ratio, inputs, params)


class GSPOParams(ClipParams):
    name: Literal["gspo"] = "gspo"


@register_policy_loss(GSPOParams, ratio_level="sequence")
def gspo_policy_loss(inputs: LossInputs, params: GSPOParams) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO(-token): :func:`vanilla_policy_loss` with one ratio per sequence,
    ``exp(mean token log-ratio)``, while gradients still flow through each token's own
    log-prob. One clip decision per sequence matches a sequence-level reward."""
    logprobs = inputs.logprobs
    seq_log_ratio = importance_log_ratio(
        logprobs, inputs.old_logprobs, inputs.response_mask, "sequence"
    )
    # Value of the sequence ratio, gradient of each token's own log-prob.
    log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    return _clipped_surrogate(log_ratio, inputs, params)


class PolicyGradientParams(Hyperparameters):
    """No hyperparameters: without a clip there is no trust region, so the update takes one
    step per batch (``UpdateConfig`` refuses more)."""

    name: Literal["pg"] = "pg"


@register_policy_loss(PolicyGradientParams)
def policy_gradient_loss(
    inputs: LossInputs, params: PolicyGradientParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy gradient without a trust region: ``-A * ratio`` per token, nothing clipped.

    Its gradient at the sampling policy (ratio 1) is ``-A * grad log pi``, the actor's term of
    A2C and REINFORCE; the ratio form keeps the value of PPO's unclipped term. Metrics:
    ``approx_kl`` and ``ratio_mean``, as :func:`vanilla_policy_loss`'s.
    """
    import torch

    log_ratio = importance_log_ratio(
        inputs.logprobs, inputs.old_logprobs, inputs.response_mask, "token"
    )
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    loss = inputs.aggregate(-inputs.advantages * ratio)
    with torch.no_grad():
        metrics = {
            "approx_kl": approx_kl(inputs.logprobs, inputs.old_logprobs, inputs.response_mask),
            "ratio_mean": masked_mean(ratio, inputs.response_mask),
        }
    return loss, metrics


class DecoupledParams(ClipParams):
    name: Literal["decoupled"] = "decoupled"
    behaviour_cap: float = Field(
        5.0,
        gt=1,
        description="tokens whose pi_old / pi_sampler exceeds it are left out of the loss "
        "(AReaL's behav_imp_weight_cap; 5 in its asynchronous recipes)",
    )


@register_policy_loss(DecoupledParams, behaviour_weighted=True)
def decoupled_policy_loss(
    inputs: LossInputs, params: DecoupledParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """AReaL's decoupled PPO objective (Fu et al. 2025) for rows sampled by older weights: the
    trust region is taken around the proximal policy ``pi_old`` (the weights before this
    update), not around the behaviour policy that sampled the tokens, and each token's clipped
    loss is weighed by ``pi_old / pi_sampler`` (no gradient), so that the update is an unbiased
    step from stale samples whose clip still bounds how far one update moves.

    Tokens whose weight exceeds ``behaviour_cap`` are left out (weight 0; they still count in
    the loss's denominators): a few tokens the sampler found unlikely and the trainer likely
    would otherwise dominate the batch. With fresh rows (``pi_sampler = pi_old``) every weight
    is 1 and the loss is :func:`vanilla_policy_loss`.

    Metrics: those of the vanilla loss, and the behaviour weights' mean, the largest ratio and
    the share of tokens left out (``is_weight_mean``, ``is_ratio_max``,
    ``is_truncated_fraction``).
    """
    import torch

    if inputs.behaviour_logprobs is None:
        raise ValueError("the decoupled loss weighs by the sampler's logprobs: none were given")
    with torch.no_grad():
        weights, weight_metrics = truncated_is_weights(
            inputs.old_logprobs,
            inputs.behaviour_logprobs,
            inputs.response_mask,
            params.behaviour_cap,
            beyond_cap="drop",
        )
    log_ratio = importance_log_ratio(
        inputs.logprobs, inputs.old_logprobs, inputs.response_mask, "token"
    )
    loss, metrics = _clipped_surrogate(log_ratio, inputs, params, weights)
    return loss, {**metrics, **weight_metrics}


class CustomLossParams(Plugin, Hyperparameters):
    """A user's own policy loss by import path, ``fn(inputs: LossInputs, **kwargs) -> (loss,
    metrics)``, token-level ratios. ``clipped``: it bounds a step away from the samples' policy
    itself, so several epochs and minibatches may reuse a batch."""

    name: Literal["custom"] = "custom"
    clipped: bool = Field(False, description="the function clips its ratio (a trust region)")

    def arguments(self) -> int:
        return 1

    @property
    def bounds_step(self) -> bool:
        return self.clipped


@register_policy_loss(CustomLossParams)
def custom_policy_loss(
    inputs: LossInputs, params: CustomLossParams
) -> tuple[Tensor, dict[str, Tensor]]:
    return params.function(inputs, **params.kwargs)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    clip_range: float | None = 0.2,
    agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic loss ``0.5 * max((V - R)^2, (V_clipped - R)^2)``.

    ``V_clipped`` keeps the new value within ``clip_range`` of the old one, so one minibatch
    cannot drag the critic far; ``None`` disables clipping. ``vf_clipfrac`` is the fraction of
    tokens where the clipped error was the larger one.
    """
    import torch

    _check_2d("values", values)
    _check_same_shape(
        values=values, old_values=old_values, returns=returns, response_mask=response_mask
    )
    unclipped = (values - returns) ** 2
    if clip_range is None:
        losses, clip_hits = unclipped, torch.zeros_like(unclipped)
    else:
        if clip_range <= 0:
            raise ValueError(f"clip_range must be positive or None, got {clip_range}")
        values_clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped = (values_clipped - returns) ** 2
        losses, clip_hits = torch.maximum(unclipped, clipped), (clipped > unclipped)
    loss = aggregate_loss(
        0.5 * losses, response_mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs
    )
    vf_clipfrac = masked_mean(clip_hits.to(values.dtype), response_mask).detach()
    return loss, {"vf_clipfrac": vf_clipfrac}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim, ``[B, T, V] -> [B, T]``.

    Stable for ``-inf`` logits (masked vocabulary): those terms count as 0, with finite grads.
    """
    import torch

    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    finite_logp = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(p * finite_logp).sum(-1)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 is a perfect critic, 0 is no
    better than a constant, negative is worse. NaN when the returns are constant."""
    _check_same_shape(values=values, returns=returns, mask=mask)
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    return 1 - var_residual / var_returns


# --------------------------------------------------------------------------------------------
# Batch shaping
# --------------------------------------------------------------------------------------------


def informative_groups(scores: Tensor, group_ids: Tensor) -> Tensor:
    """``[B]`` bool: False for every member of a group whose scores are all equal.

    Such groups have zero advantage under any group baseline, so they only dilute the loss.
    """
    import torch

    if scores.dim() != 1 or group_ids.shape != scores.shape or group_ids.is_floating_point():
        raise ValueError(
            "need 1-D scores and integer group_ids of the same shape, got "
            f"{tuple(scores.shape)} and {group_ids.dtype} {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    highest = scores.new_zeros(n_groups).scatter_reduce(
        0, inverse, scores, "amax", include_self=False
    )
    lowest = scores.new_zeros(n_groups).scatter_reduce(
        0, inverse, scores, "amin", include_self=False
    )
    return (highest != lowest)[inverse]


# --------------------------------------------------------------------------------------------
# Algorithms: named recipes over the registries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Algorithm:
    """What users call an algorithm: an advantage estimator and a policy loss with the
    hyperparameters its paper uses, and the update settings it changes. They are the defaults
    of the update's config (its ``advantage``, ``policy_loss``, ``loss_agg_mode`` and
    ``mask_truncated``): a setting given there replaces the preset's whole."""

    advantage: Hyperparameters
    policy_loss: Hyperparameters = field(default_factory=VanillaParams)
    loss_agg_mode: str = "token-mean"
    mask_truncated: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        # A preset naming an unregistered estimator or loss fails when it is registered.
        ADVANTAGE_ESTIMATORS[self.advantage.name]
        POLICY_LOSSES[self.policy_loss.name]
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}")


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")


def register_algorithm(name: str, algorithm: Algorithm) -> Algorithm:
    return ALGORITHMS.register(name, algorithm)


def get_algorithm(name: str) -> Algorithm:
    return ALGORITHMS[name]


register_algorithm(
    "grpo",
    Algorithm(
        GRPOParams(),
        description="GRPO (Shao et al. 2024): group z-scored outcome advantages, the PPO clip "
        "loss, no critic. Token-mean aggregation as TRL and verl default to (the paper's mean "
        "per sequence is loss_agg_mode='seq-mean-token-mean'); the paper's KL in the loss is "
        "opt-in (kl_in='loss', kl_coef=0.04).",
    ),
)
register_algorithm(
    "dr_grpo",
    Algorithm(
        GRPOParams(norm_by_std=False),
        loss_agg_mode="seq-mean-token-sum",
        description="Dr. GRPO (Liu et al. 2025): GRPO without the two biases, the std division "
        "of the advantage and the per-sequence length normalisation: token sums over a constant "
        "(the number of sequences), so long wrong answers are not favoured.",
    ),
)
register_algorithm(
    "dapo",
    Algorithm(
        GRPOParams(),
        VanillaParams(clip_low=0.2, clip_high=0.28),
        mask_truncated=True,
        description="DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28) against entropy collapse, "
        "token-level mean, no KL, groups of equal rewards dropped (the RL stage resamples to "
        "refill them: RLConfig.dynamic_sampling) and truncated completions masked (overlong "
        "filtering); the last three are the update's defaults.",
    ),
)
register_algorithm(
    "rloo",
    Algorithm(
        RLOOParams(),
        description="RLOO (Ahmadian et al. 2024): leave-one-out group baseline, unbiased; one "
        "optimizer step per batch makes the clip loss plain REINFORCE.",
    ),
)
register_algorithm(
    "reinforce++",
    Algorithm(
        ReinforcePPParams(),
        description="REINFORCE++ (Hu 2025): return-to-go whitened over the whole batch with the "
        "PPO clip loss; the paper's KL in the reward is opt-in (kl_in='reward').",
    ),
)
register_algorithm(
    "reinforce++_baseline",
    Algorithm(
        ReinforcePPBaselineParams(),
        description="REINFORCE++ with a group-mean baseline before the global whitening.",
    ),
)
register_algorithm(
    "a2c",
    Algorithm(
        GAEParams(lam=0.0),
        PolicyGradientParams(),
        description="A2C (Mnih et al. 2016, synchronous): the critic's one-step TD advantage "
        "A_t = r_t + gamma V(s_{t+1}) - V(s_t) (GAE with lam 0), not whitened, and the policy "
        "gradient without clipping, one optimizer step per batch; the critic trains beside it "
        "(at one step on-policy its value clip does not bind). advantage.lam 1 gives the Monte "
        "Carlo return minus V instead (Stable-Baselines3's default).",
    ),
)
register_algorithm(
    "ppo",
    Algorithm(
        GAEParams(lam=0.95, whiten=True),
        description="PPO (Schulman et al. 2017; Ouyang et al. 2022): GAE advantages from a "
        "critic trained alongside (clipped value loss), whitened per batch.",
    ),
)
