"""The settings of the policy update (:class:`UpdateConfig`), apart from the updater that reads
them (:mod:`.policy_update`): a run's config loads, and its flags are read, without torch."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...settings.config import Seed
from .algorithms import (
    ALGORITHMS,
    AdvantageEstimator,
    AdvantageParams,
    Algorithm,
    PolicyLoss,
    PolicyLossParams,
    get_advantage_estimator,
    get_algorithm,
    get_policy_loss,
)

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


def _preset(data: dict[str, Any]) -> Algorithm:
    """The algorithm named in the fields validated so far (a default factory's argument)."""
    name = data.get("algorithm", "grpo")
    return ALGORITHMS[name] if name in ALGORITHMS else ALGORITHMS["grpo"]


class UpdateConfig(BaseModel):
    """Settings of one policy update. Sizes count sequences (completions).

    ``algorithm`` names a preset of the registry: the defaults of ``advantage``,
    ``policy_loss``, ``loss_agg_mode`` and ``mask_truncated``. Each of them, given here,
    replaces the preset's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Spellings of earlier versions, refused with the new one's name.
    renamed: ClassVar[dict[str, str]] = {
        "lr": "learning_rate",
        "critic_lr": "critic_learning_rate",
        "advantage_args": "advantage",
        "policy_loss_args": "policy_loss",
        "clip_low": "policy_loss.clip_low",
        "clip_high": "policy_loss.clip_high",
        "dual_clip": "policy_loss.dual_clip",
        "ratio_level": "policy_loss.name (token: vanilla, sequence: gspo)",
        "norm_adv_by_std": "advantage.norm_by_std",
        "gamma": "advantage.gamma",
        "lam": "advantage.lam",
        "whiten_advantages": "advantage.whiten",
    }

    algorithm: str = Field(
        "grpo",
        description="a preset of algorithms.ALGORITHMS (grpo, dr_grpo, dapo, rloo, reinforce++, "
        "reinforce++_baseline, a2c, ppo): the defaults of advantage, policy_loss, loss_agg_mode "
        "and mask_truncated",
    )
    advantage: AdvantageParams = Field(
        default_factory=lambda data: _preset(data).advantage,
        description="the advantage estimator and its hyperparameters, {name: ..., ...}: grpo "
        "(norm_by_std, eps), rloo, reinforce++ (gamma, eps), reinforce++_baseline (eps), gae "
        "(gamma, lam, whiten; trains a critic); default: the algorithm's",
    )
    policy_loss: PolicyLossParams = Field(
        default_factory=lambda data: _preset(data).policy_loss,
        description="the policy loss and its hyperparameters, {name: ..., ...}: vanilla or gspo "
        "(clip_low, clip_high, dual_clip), or decoupled (and behaviour_cap: AReaL's objective "
        "for rows sampled by older weights); default: the algorithm's",
    )
    epochs: int = Field(1, ge=1, le=100, description="passes over each rollout batch")
    minibatch_size: int | None = Field(
        None, ge=1, description="sequences per optimizer step, all ranks together; None = batch"
    )
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward, per rank")
    learning_rate: float = Field(1e-6, gt=0, le=1, description="AdamW's, for the policy")
    critic_learning_rate: float | None = Field(
        None, gt=0, le=1, description="the critic's (ppo); None = learning_rate"
    )
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss_agg_mode: AggMode = Field(
        default_factory=lambda data: cast(AggMode, _preset(data).loss_agg_mode),
        description="how token losses add up: token-mean, seq-mean-token-sum (Dr. GRPO), "
        "seq-mean-token-mean (the GRPO paper); default: the algorithm's",
    )
    kl_in: Literal["reward", "loss", "none"] = "none"
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_ratio_weighted: bool = Field(
        False,
        description="kl_in='loss': weigh the per-token KL by the policy ratio, which makes its "
        "gradient the unbiased reverse-KL gradient (DeepSeek-V3.2; TRL's use_bias_correction_kl)",
    )
    adaptive_kl_target: float | None = Field(
        None, gt=0, description="steer the KL to the reference to this value; None = fixed kl_coef"
    )
    adaptive_kl_horizon: int = Field(10_000, ge=1)
    target_kl: float | None = Field(
        None, gt=0, description="stop the epochs once approx KL to the sampling policy exceeds it"
    )
    entropy_coef: float = Field(0.0, ge=0)
    vf_coef: float = Field(0.5, ge=0)
    value_clip: float | None = Field(0.2, gt=0)
    drop_uniform_groups: bool = True
    mask_truncated: bool = Field(
        default_factory=lambda data: _preset(data).mask_truncated,
        description="truncated completions set their group's baseline but do not train (TRL's "
        "mask_truncated_completions); default: the algorithm's",
    )
    sampler_is_cap: float | None = Field(
        None,
        ge=1,
        description="truncated importance sampling against the sampler/trainer mismatch: weigh "
        "each token by min(pi_old / pi_sampler, cap), as TRL's and verl's; None = off",
    )
    bf16: bool = False
    seed: Seed = 0

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_algorithm(name)  # an unknown name fails listing the known
        return name

    @model_validator(mode="after")
    def _consistent(self) -> UpdateConfig:
        if self.minibatch_size is not None and self.micro_batch_size > self.minibatch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} exceeds minibatch_size={self.minibatch_size}"
            )
        if self.kl_in == "none" and (self.kl_coef > 0 or self.adaptive_kl_target is not None):
            raise ValueError("kl_coef / adaptive_kl_target are set but kl_in='none'")
        if self.kl_in != "none" and self.kl_coef == 0:
            raise ValueError(f"kl_in={self.kl_in!r} needs kl_coef > 0")
        if self.kl_ratio_weighted and self.kl_in != "loss":
            raise ValueError("kl_ratio_weighted applies to the KL in the loss (kl_in='loss')")
        if not self.policy_loss.bounds_step and (
            self.epochs > 1 or self.minibatch_size is not None
        ):
            raise ValueError(
                f"policy_loss {self.policy_loss.name!r} has no clip to bound a step away from "
                f"the samples' policy: it takes one step on the whole batch (epochs 1, no "
                f"minibatch_size), got epochs={self.epochs}, minibatch_size={self.minibatch_size}"
            )
        if self.sampler_is_cap is not None and self.loss.behaviour_weighted:
            raise ValueError(
                f"policy_loss {self.policy_loss.name!r} weighs each token by pi_old / pi_sampler "
                "itself: with sampler_is_cap the weight would apply twice; drop sampler_is_cap"
            )
        return self

    @property
    def corrects_off_policy(self) -> bool:
        """Whether the update weighs tokens by ``pi_old / pi_sampler`` (rows sampled by other
        weights than the trainer's)."""
        return self.sampler_is_cap is not None or self.loss.behaviour_weighted

    @property
    def estimator(self) -> AdvantageEstimator:
        return get_advantage_estimator(self.advantage.name)

    @property
    def loss(self) -> PolicyLoss:
        return get_policy_loss(self.policy_loss.name)

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def needs_reference(self) -> bool:
        return self.kl_in != "none"
