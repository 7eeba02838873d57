"""The policy update: scored rollouts + policy (+ reference, + critic) -> new weights + metrics.

One :class:`PolicyUpdater` serves every algorithm of :data:`~.algorithms.ALGORITHMS` (GRPO,
Dr. GRPO, DAPO, RLOO, REINFORCE++, PPO, ...); they differ only in the config's advantage
estimator and policy loss (each with its hyperparameters, named by the registries), settings
such as where the KL to the reference goes (reward or loss), and whether a critic trains
alongside (the estimator's need). ``update`` reads top to bottom like CleanRL's ``ppo.py``:

1. shape the batch (drop groups without signal, mask truncated completions);
2. score it without gradients: old logprobs, reference logprobs, critic values;
3. rewards -> advantages and returns;
4. epochs x shuffled minibatches x micro-batches: loss, backward, clip, step;
   stop early when the policy has moved too far from the sampling policy.

Built on ``accelerate``: the same code runs in one CPU process or on many GPUs (DDP/FSDP).
Every rank holds the whole (token-id) batch and trains on its share of each minibatch, so the
global token and sequence counts that make the loss independent of micro-batching and world
size are known everywhere without communication.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast, overload

import torch
from accelerate import Accelerator
from torch import Tensor, nn

from ..logprobs import ModelInputs, completion_logits, completion_logprobs
from ..model_config import ModelConfig
from ..sharding import LORA_REFUSED, make_accelerator
from .algorithms import (
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    LossInputs,
    entropy_from_logits,
    explained_variance,
    importance_log_ratio,
    informative_groups,
    kl_penalty,
    masked_mean,
    outcome_to_token_rewards,
    truncated_is_weights,
    value_loss,
)
from .batches import RolloutBatch
from .metric_names import IS_WEIGHT_METRICS, MAXIMA, Sampler, Update, loss_metric
from .models import ActorCritic, ValueModel, disable_dropout
from .update_config import UpdateConfig

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


@dataclass
class PreparedBatch:
    """A batch ready for gradient steps: rows that train, with everything the loss needs."""

    batch: RolloutBatch
    loss_mask: Tensor  # [B, T]
    advantages: Tensor  # [B, T]
    returns: Tensor | None  # [B, T], critic targets (ppo)
    old_logprobs: Tensor | None  # [B, T]; None: the single step reads them from its own forward
    ref_logprobs: Tensor | None  # [B, T]
    old_values: Tensor | None  # [B, T]
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch)

    def select(self, rows: Tensor) -> PreparedBatch:
        """The rows ``rows``, padding trimmed."""
        batch = self.batch.select(rows)
        take = functools.partial(_take, rows=rows, width=batch.completion_ids.shape[1])
        return PreparedBatch(
            batch,
            take(self.loss_mask),
            take(self.advantages),
            take(self.returns),
            take(self.old_logprobs),
            take(self.ref_logprobs),
            take(self.old_values),
            self.metrics,
        )


@overload
def _take(x: Tensor, *, rows: Tensor, width: int) -> Tensor: ...
@overload
def _take(x: Tensor | None, *, rows: Tensor, width: int) -> Tensor | None: ...
def _take(x: Tensor | None, *, rows: Tensor, width: int) -> Tensor | None:
    """Rows ``rows`` of a ``[B, T]`` tensor, its first ``width`` tokens (None stays None)."""
    return None if x is None else x[rows, :width]


@dataclass(frozen=True)
class MicroBatch:
    """One forward's worth of a minibatch on this rank: the policy's logits and logprobs (with
    gradients) and the critic's values, beside what :meth:`PolicyUpdater.prepare` computed for
    the same rows. ``loss`` is what the policy loss reads."""

    logits: Tensor  # [b, t, V]
    values: Tensor | None  # [b, t], the critic's (ppo)
    loss: LossInputs
    ref_logprobs: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None

    @property
    def tokens(self) -> Tensor:
        """The tokens that train: the weight of this micro-batch's means."""
        return self.loss.response_mask.sum()


class _Totals:
    """Metrics gathered over micro-batches (token-weighted means, sums, maxima), then reduced
    over ranks in one call per kind."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}
        self.maxima: dict[str, Tensor] = {}

    def mean(self, name: str, local_mean: Tensor, weight: Tensor) -> None:
        self.add(name, local_mean * weight)
        self.weights[name] = self.weights.get(name, 0) + weight.detach().float()

    def add(self, name: str, value: Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0) + value.detach().float()

    def max(self, name: str, value: Tensor) -> None:
        value = value.detach().float()
        self.maxima[name] = (
            torch.maximum(self.maxima[name], value) if name in self.maxima else value
        )

    def reduce(self, accelerator: Accelerator) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.sums:
            names, weighted = list(self.sums), list(self.weights)
            stacked = torch.stack(
                [self.sums[n] for n in names] + [self.weights[n] for n in weighted]
            )
            reduced = accelerator.reduce(stacked.to(accelerator.device), reduction="sum").tolist()
            out.update(zip(names, reduced[: len(names)], strict=True))
            for name, weight in zip(weighted, reduced[len(names) :], strict=True):
                out[name] = out[name] / weight if weight > 0 else math.nan
        if self.maxima:
            names = list(self.maxima)
            stacked = torch.stack([self.maxima[n] for n in names]).to(accelerator.device)
            out.update(
                zip(names, accelerator.reduce(stacked, reduction="max").tolist(), strict=True)
            )
        return out


def _add_sampler_mismatch(
    totals: _Totals, logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor
) -> None:
    """How far the trainer's logprobs are from the sampler's (vLLM kernels, bf16, stale weights):
    large values mean the 'on-policy' ratio is already off before any step."""
    valid = (mask != 0) & ~torch.isnan(sampling_logprobs)
    sampled = torch.where(valid, sampling_logprobs, logprobs)
    diff = (logprobs - sampled).abs()
    weight = valid.sum()
    totals.mean(Sampler.LOGPROB_DIFF_MEAN, masked_mean(diff, valid.float()), weight)
    totals.max(Sampler.LOGPROB_DIFF_MAX, torch.where(valid, diff, 0.0).max())
    totals.mean(Sampler.KL, masked_mean(kl_penalty(sampled, logprobs, "k3"), valid.float()), weight)


class PolicyUpdater:
    """Owns the accelerator, the (wrapped) policy and critic, the optimizer and the KL controller.

    ``policy`` is a causal LM; ``model_config`` says how it trains (LoRA, gradient
    checkpointing), as for SFT and DPO; ``ref_model`` a frozen copy for the KL term (not needed
    with LoRA: the base model with adapters off is the reference); ``critic`` a
    :class:`ValueModel` (PPO).
    """

    def __init__(
        self,
        config: UpdateConfig,
        policy: nn.Module,
        *,
        model_config: ModelConfig | None = None,
        ref_model: nn.Module | None = None,
        critic: ValueModel | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.config = cfg = config
        self.model_config = model_config = model_config or ModelConfig()
        if cfg.needs_critic != (critic is not None):
            raise ValueError(
                f"advantage estimator {cfg.advantage.name!r} "
                + ("needs a critic (ValueModel)" if critic is None else "does not use a critic")
            )
        # With LoRA the base model (adapters off) is the reference: no second copy.
        self._adapter_reference = (
            cfg.needs_reference
            and ref_model is None
            and (model_config.lora_r > 0 or _is_peft(policy))
        )
        if cfg.needs_reference and ref_model is None and not self._adapter_reference:
            raise ValueError(f"kl_in={cfg.kl_in!r} needs a ref_model (or a LoRA policy)")
        self.accelerator = accelerator or make_accelerator("bf16" if cfg.bf16 else "no")
        self.sharded = self.accelerator.is_fsdp2
        policy = self._trainable(policy, critic)
        self.ref_model = None
        if cfg.needs_reference and ref_model is not None:
            self.ref_model = ref_model.to(self.accelerator.device).eval().requires_grad_(False)
        self.model, self.optimizer = self.accelerator.prepare(
            ActorCritic(policy, critic).train(), self._optimizer(policy, critic)
        )
        if self.sharded:
            parameter = next(self.model.parameters())
            log.info(
                "policy update: FSDP2 over %d ranks, parameters %s of local shape %s",
                self.accelerator.num_processes,
                type(parameter).__name__,
                tuple(parameter.to_local().shape),
            )
        self.kl_controller = (
            AdaptiveKLController(cfg.kl_coef, cfg.adaptive_kl_target, cfg.adaptive_kl_horizon)
            if cfg.adaptive_kl_target is not None
            else FixedKLController(cfg.kl_coef)
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def _trainable(self, policy: nn.Module, critic: ValueModel | None) -> nn.Module:
        """The policy (with its LoRA adapter, if the model config asks for one) and the critic
        made ready to train: dropout off, gradient checkpointing on where asked."""
        peft_config = self.model_config.peft_config()
        if self.sharded and (peft_config is not None or _is_peft(policy)):
            raise ValueError(LORA_REFUSED)
        if peft_config is not None:
            from peft import get_peft_model  # peft loads only with LoRA

            policy = get_peft_model(policy, peft_config)
        for module in (policy, critic):
            if module is None:
                continue
            disable_dropout(module)
            if self.model_config.gradient_checkpointing:
                # the policy is a causal LM (or its PeftModel, which forwards the call)
                target = module.backbone if isinstance(module, ValueModel) else module
                target = cast("PreTrainedModel", target)
                target.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
        return policy

    def _optimizer(self, policy: nn.Module, critic: ValueModel | None) -> torch.optim.Optimizer:
        cfg = self.config
        groups = [
            {"params": [p for p in policy.parameters() if p.requires_grad], "lr": cfg.learning_rate}
        ]
        if critic is not None:
            critic_rate = cfg.critic_learning_rate or cfg.learning_rate
            groups.append({"params": list(critic.parameters()), "lr": critic_rate})
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    @property
    def actor_critic(self) -> ActorCritic:
        return self.accelerator.unwrap_model(self.model)

    @property
    def policy(self) -> nn.Module:
        """The trained policy (a PeftModel under LoRA), for sampling and saving."""
        return self.actor_critic.policy

    @property
    def critic(self) -> ValueModel | None:
        return self.actor_critic.critic

    @torch.no_grad()
    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """The policy's float32 logprobs of each of ``ids`` after the first (the weight-refresh
        probe), through the wrapped model: under FSDP a forward is collective, every rank
        calls it."""
        sequence = torch.tensor([ids], device=self.accelerator.device)
        inputs = ModelInputs(
            input_ids=sequence,
            attention_mask=torch.ones_like(sequence),
            position_ids=torch.arange(len(ids), device=sequence.device)[None],
            completion_ids=sequence[:, 1:],
            temperature=torch.ones(1, device=sequence.device),
        )
        logits, _ = self.model(inputs)
        return completion_logprobs(logits, inputs.completion_ids)[0].tolist()

    # ----------------------------------------------------------------------------------------
    # The update
    # ----------------------------------------------------------------------------------------

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """Train on one batch of scored rollouts; returns the metrics of this update.

        Losses, clip fractions, approx KL, entropy, KL to the reference, value metrics and grad
        norm are averaged over the optimizer steps taken; the rest describe the batch.
        """
        cfg = self.config
        prepared = self.prepare(batch)
        minibatches = self._minibatches(len(prepared))
        steps: list[dict[str, float]] = []
        for rows in minibatches:
            step = self.backward_minibatch(prepared, rows)
            norm = self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            step[Update.GRAD_NORM] = float(norm.full_tensor() if self.sharded else norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            steps.append(step)
            if cfg.target_kl is not None and step[Update.APPROX_KL] > cfg.target_kl:
                break  # the policy has left the trust region of the sampling policy

        metrics = dict(prepared.metrics)
        for name in steps[0] if steps else ():
            values = [step[name] for step in steps]
            metrics[name] = max(values) if name in MAXIMA else sum(values) / len(values)
        metrics[Update.OPTIMIZER_STEPS] = float(len(steps))
        metrics[Update.EARLY_STOPPED] = float(len(steps) < len(minibatches))
        metrics[Update.KL_COEF] = self.kl_controller.value
        if Update.KL_REF in metrics:
            self.kl_controller.update(metrics[Update.KL_REF], n_steps=len(prepared))
        return metrics

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch) -> PreparedBatch:
        """Steps 1-3: shape the batch, score it, turn rewards into advantages."""
        cfg = self.config
        batch = batch.to(self.accelerator.device)
        metrics = {
            Update.REWARD_MEAN: batch.rewards.mean().item(),
            Update.ROLLOUTS: float(len(batch)),
        }

        # 1. A group whose rewards are all equal has zero advantage under a group baseline.
        if cfg.drop_uniform_groups:
            batch = batch.select(informative_groups(batch.rewards, batch.group_ids))
        if len(batch) == 0:
            metrics[Update.TRAINED_FRACTION] = 0.0
            empty = batch.response_mask
            return PreparedBatch(batch, empty, empty, None, None, None, None, metrics)
        lengths = batch.completion_lengths.float()
        metrics[Update.RESPONSE_LENGTH_MEAN] = lengths.mean().item()
        metrics[Update.RESPONSE_LENGTH_MAX] = lengths.max().item()
        metrics[Update.TRUNCATED_FRACTION] = batch.truncated.float().mean().item()

        # 2. Scoring passes. Old logprobs are only needed when more than one optimizer step
        # reuses the batch (or for the KL reward); otherwise the one step's own forward gives them.
        steps_per_epoch = math.ceil(len(batch) / (cfg.minibatch_size or len(batch)))
        needs_old = (
            cfg.epochs * steps_per_epoch > 1
            or cfg.kl_in == "reward"
            or self.critic is not None
            or cfg.sampler_is_cap is not None
        )
        scores = _Totals()
        old_logprobs, old_values, ref_logprobs = self._score(
            batch, policy=needs_old, reference=cfg.needs_reference, totals=scores
        )
        metrics.update(scores.reduce(self.accelerator))

        # 3. Rewards -> advantages (and the critic's targets).
        advantages, returns = self._advantages(
            batch, old_logprobs, ref_logprobs, old_values, metrics
        )

        # Truncated completions still set their group's baseline above; they just do not train.
        loss_mask = batch.response_mask
        if cfg.mask_truncated:
            loss_mask = loss_mask * (~batch.truncated)[:, None]
        prepared = PreparedBatch(
            batch, loss_mask, advantages, returns, old_logprobs, ref_logprobs, old_values, metrics
        )
        trains = loss_mask.sum(-1) > 0
        if not bool(trains.all()):
            prepared = prepared.select(trains.nonzero().squeeze(1))
        metrics[Update.TRAINED_FRACTION] = len(prepared) / metrics[Update.ROLLOUTS]
        return prepared

    def _advantages(
        self,
        batch: RolloutBatch,
        old_logprobs: Tensor | None,
        ref_logprobs: Tensor | None,
        old_values: Tensor | None,
        metrics: dict[str, float],
    ) -> tuple[Tensor, Tensor | None]:
        """The verifier score on the last token, minus the per-token KL (PPO style), through
        the estimator; then the truncated importance weights. Returns the advantages and, with
        a critic, its targets."""
        cfg = self.config
        response_mask = batch.response_mask
        token_rewards = outcome_to_token_rewards(batch.rewards, response_mask)
        if cfg.kl_in == "reward":
            assert old_logprobs is not None and ref_logprobs is not None  # needs_old, reference
            kl = kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator) * response_mask
            metrics[Update.KL_REF] = masked_mean(kl, response_mask).item()
            token_rewards = token_rewards - self.kl_controller.value * kl
        inputs = AdvantageInputs(
            token_rewards, response_mask, batch.group_ids, old_values, batch.columns
        )
        advantages, returns = cfg.estimator(inputs, cfg.advantage)
        if self.critic is not None:
            assert old_values is not None  # needs_old with a critic
            metrics[Update.EXPLAINED_VARIANCE] = explained_variance(
                old_values, returns, response_mask
            ).item()
            metrics[Update.VALUE_MEAN] = masked_mean(old_values, response_mask).item()
        if cfg.sampler_is_cap is not None:
            # A positive per-token weight on the advantage scales that token's clipped loss.
            assert old_logprobs is not None  # needs_old
            weights, is_metrics = truncated_is_weights(
                old_logprobs, batch.sampling_logprobs, response_mask, cfg.sampler_is_cap
            )
            advantages = advantages * weights
            metrics.update({IS_WEIGHT_METRICS[k]: value.item() for k, value in is_metrics.items()})
        return advantages, returns if self.critic is not None else None

    def backward_minibatch(self, prepared: PreparedBatch, rows: Tensor) -> dict[str, float]:
        """Step 4 for one minibatch: accumulate its gradient over this rank's micro-batches.
        The loss of each is the sum of the named terms below.

        Each micro-batch loss is its share of the minibatch loss (global counts), times the
        world size because DDP averages gradients over ranks: the summed gradient is the
        minibatch gradient whatever the micro-batch size and the number of ranks.
        """
        minibatch_mask = prepared.loss_mask[rows]
        counts = {
            "num_tokens": minibatch_mask.sum().item(),
            "num_seqs": (minibatch_mask.sum(-1) > 0).sum().item(),
        }
        totals = _Totals()
        micro_batches = list(self._rank_micro_batches(prepared.batch, rows))
        for i, (micro_rows, real) in enumerate(micro_batches):
            is_last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if is_last else self.accelerator.no_sync(self.model):
                micro = self._forward(prepared, micro_rows, real, counts, totals)
                loss = (
                    self._policy_term(micro, totals)
                    + self._entropy_term(micro, totals)
                    + self._kl_term(micro, totals)
                    + self._value_term(micro, totals)
                )
                totals.add(Update.LOSS, loss)
                self.accelerator.backward(loss * self.accelerator.num_processes)
        # Loss shares add up (over micro-batches and ranks) to the minibatch loss.
        return totals.reduce(self.accelerator)

    def _forward(
        self,
        prepared: PreparedBatch,
        rows: Tensor,
        real: float,
        counts: dict[str, float],
        totals: _Totals,
    ) -> MicroBatch:
        """The forward of rows ``rows`` (``real`` 0: a stand-in row that must not count)."""
        batch = prepared.batch
        inputs = batch.model_inputs(rows)
        take = functools.partial(_take, rows=rows, width=inputs.completion_ids.shape[1])
        mask = take(prepared.loss_mask) * real
        logits, values = self.model(inputs)
        logprobs = completion_logprobs(logits, inputs.completion_ids)
        old_logprobs = take(prepared.old_logprobs)
        if old_logprobs is None:  # one optimizer step: the policy has not moved yet
            old_logprobs = logprobs.detach()
            _add_sampler_mismatch(totals, old_logprobs, take(batch.sampling_logprobs), mask)
        loss_inputs = LossInputs(
            logprobs,
            old_logprobs,
            take(prepared.advantages),
            mask,
            agg_mode=self.config.loss_agg_mode,
            columns={name: column[rows] for name, column in batch.columns.items()},
            behaviour_logprobs=take(batch.sampling_logprobs),
            **counts,
        )
        return MicroBatch(
            logits,
            values,
            loss_inputs,
            take(prepared.ref_logprobs),
            take(prepared.old_values),
            take(prepared.returns),
        )

    # The terms of the loss, each with its metrics: the policy loss, an entropy bonus, the KL to
    # the reference (kl_in="loss") and the critic's loss (ppo). A term that is off adds 0.

    def _policy_term(self, micro: MicroBatch, totals: _Totals) -> Tensor:
        loss, metrics = self.config.loss(micro.loss, self.config.policy_loss)
        totals.add(Update.POLICY_LOSS, loss)
        for name, value in metrics.items():
            metric = loss_metric(name)
            if metric in MAXIMA:
                totals.max(metric, value)
            else:
                totals.mean(metric, value, micro.tokens)
        return loss

    def _entropy_term(self, micro: MicroBatch, totals: _Totals) -> Tensor | float:
        coef = self.config.entropy_coef
        with contextlib.nullcontext() if coef else torch.no_grad():
            entropy = entropy_from_logits(micro.logits)
        totals.mean(Update.ENTROPY, masked_mean(entropy, micro.loss.response_mask), micro.tokens)
        return -(coef * micro.loss.aggregate(entropy)) if coef else 0.0

    def _kl_term(self, micro: MicroBatch, totals: _Totals) -> Tensor | float:
        cfg = self.config
        if cfg.kl_in != "loss":
            return 0.0
        assert micro.ref_logprobs is not None  # prepare() scored the reference
        inputs = micro.loss
        kl = kl_penalty(inputs.logprobs, micro.ref_logprobs, cfg.kl_estimator)
        totals.mean(Update.KL_REF, masked_mean(kl, inputs.response_mask), micro.tokens)
        if cfg.kl_ratio_weighted:
            ratio_level = cfg.loss.ratio_level
            log_ratio = importance_log_ratio(
                inputs.logprobs, inputs.old_logprobs, inputs.response_mask, ratio_level
            )
            kl = kl * torch.exp(log_ratio)
        return self.kl_controller.value * inputs.aggregate(kl)

    def _value_term(self, micro: MicroBatch, totals: _Totals) -> Tensor | float:
        if micro.values is None:
            return 0.0
        assert micro.old_values is not None and micro.returns is not None
        inputs = micro.loss
        vf_loss, vf_metrics = value_loss(
            micro.values,
            micro.old_values,
            micro.returns,
            inputs.response_mask,
            clip_range=self.config.value_clip,
            agg_mode=inputs.agg_mode,
            num_tokens=inputs.num_tokens,
            num_seqs=inputs.num_seqs,
        )
        totals.add(Update.VALUE_LOSS, vf_loss)
        totals.mean(Update.VF_CLIPFRAC, vf_metrics["vf_clipfrac"], micro.tokens)
        return self.config.vf_coef * vf_loss

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _minibatches(self, num_rows: int) -> list[Tensor]:
        """Row indices of every optimizer step: ``epochs`` shuffles, each split in minibatches.
        The generator is seeded alike on every rank, so all ranks agree."""
        if num_rows == 0:
            return []
        size = self.config.minibatch_size or num_rows
        return [
            rows.to(self.accelerator.device)
            for _ in range(self.config.epochs)
            for rows in torch.randperm(num_rows, generator=self.generator).split(size)
        ]

    def _rank_micro_batches(
        self, batch: RolloutBatch, rows: Tensor
    ) -> Iterator[tuple[Tensor, float]]:
        """This rank's rows of a minibatch in micro-batches, shortest first (less padding).

        Every rank yields the same number of micro-batches, as DDP needs one backward each;
        a rank short of rows repeats a row with weight 0.
        """
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = rows[rank::world]
        lengths = batch.prompt_lengths[mine] + batch.completion_lengths[mine]
        mine = mine[torch.argsort(lengths, stable=True)]
        per_rank = math.ceil(len(rows) / world)
        count = math.ceil(per_rank / self.config.micro_batch_size)
        chunks = list(mine.split(self.config.micro_batch_size))
        for chunk in chunks:
            yield chunk, 1.0
        for _ in range(count - len(chunks)):
            yield rows[:1], 0.0

    def _score(
        self, batch: RolloutBatch, *, policy: bool, reference: bool, totals: _Totals
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Old logprobs, old values and reference logprobs for the whole batch: each rank scores
        its rows, one all-reduce (sum over disjoint rows) shares them."""
        shape = batch.completion_ids.shape
        device = self.accelerator.device
        old = torch.zeros(shape, device=device) if policy else None
        values = torch.zeros(shape, device=device) if policy and self.critic else None
        ref = torch.zeros(shape, device=device) if reference else None
        if old is None and ref is None:
            return None, None, None
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        chunks = list(
            torch.arange(len(batch), device=device)[rank::world].split(self.config.micro_batch_size)
        )
        if self.sharded and old is not None:  # forwards are collective: as many on each rank
            count = math.ceil(math.ceil(len(batch) / world) / self.config.micro_batch_size)
            for _ in range(count - len(chunks)):
                self.model(batch.model_inputs(torch.zeros(1, dtype=torch.long, device=device)))
        for rows in chunks:
            inputs = batch.model_inputs(rows)
            width = inputs.completion_ids.shape[1]
            if old is not None:
                logits, micro_values = self.model(inputs)
                old[rows, :width] = completion_logprobs(logits, inputs.completion_ids)
                _add_sampler_mismatch(
                    totals,
                    old[rows, :width],
                    batch.sampling_logprobs[rows, :width],
                    batch.response_mask[rows, :width],
                )
                if values is not None:
                    values[rows, :width] = micro_values
            if ref is not None:
                ref[rows, :width] = completion_logprobs(
                    self._reference_logits(inputs), inputs.completion_ids
                )
        shared = [x for x in (old, values, ref) if x is not None]
        if world > 1:
            shared = self.accelerator.reduce(shared, reduction="sum")
        shared_iter = iter(shared)
        old, values, ref = (
            next(shared_iter) if x is not None else None for x in (old, values, ref)
        )
        return old, values, ref

    def _reference_logits(self, inputs) -> Tensor:
        with self.accelerator.autocast():
            if not self._adapter_reference:
                assert self.ref_model is not None  # __init__ checked it
                return completion_logits(self.ref_model, inputs)
            with cast("PeftModel", self.policy).disable_adapter():
                return completion_logits(self.policy, inputs)


def _is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
