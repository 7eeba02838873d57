"""Every metric the RL stage records (``metrics.jsonl``, the iteration manifests, the curves), in
one place, by namespace:

* ``data/``: what was sampled and scored and how the batch was filled (dynamic sampling);
* ``reward/``: the verifier's rewards of the iteration's scored completions;
* ``sampler/``: how far the sampler's logprobs are from the trainer's (off-policy drift);
* ``update/``: the policy update (losses, clipping, KL, gradient, steps);
* ``queue/``: the asynchronous loop (``rl.asynchronous``): how stale the trained rows were,
  what was dropped as too stale, the queue between the sampler's process and the trainer;
* ``time/``: wall seconds per phase of the iteration.

A statistic of a quantity is a level of its own (``update/response_length/max``), never a
suffix that code has to parse. Names are ``<namespace>/<quantity>[/<statistic>]``; four
families are named at run time: :func:`reward_component`, :func:`status_count` (the
verifier's status values) and :func:`staleness_count`.
"""

from __future__ import annotations

import re
from typing import Final

ITERATION: Final = "iteration"  # the x axis of every curve, 1-based


class Data:
    SAMPLES: Final = "data/samples"  # completions scored this iteration
    SANDBOX_ERRORS: Final = "data/sandbox_errors"  # of those, runs the sandbox failed
    SAMPLING_ROUNDS: Final = "data/sampling_rounds"  # dynamic sampling's rounds
    GROUPS_SAMPLED: Final = "data/groups_sampled"  # prompts sampled
    GROUPS_TRAINED: Final = "data/groups_trained"  # informative groups the update used
    GROUPS_DROPPED: Final = "data/groups_dropped"  # uniform under the run's metric: not trained
    # Groups sampled whose metric is the same for every sample, under each metric (whatever the
    # run's metric is): what `pass`, `tests` and `reward` would drop, on the same groups.
    GROUPS_UNIFORM_PASS: Final = "data/groups_uniform/pass"
    GROUPS_UNIFORM_TESTS: Final = "data/groups_uniform/tests"
    GROUPS_UNIFORM_REWARD: Final = "data/groups_uniform/reward"
    GROUPS_UNIFORM: Final = {
        "pass": GROUPS_UNIFORM_PASS,
        "tests": GROUPS_UNIFORM_TESTS,
        "reward": GROUPS_UNIFORM_REWARD,
    }
    SCHEDULE_BATCHES: Final = "data/schedule_batches"  # prompt batches drawn so far (resume)
    EPOCH: Final = "data/epoch"  # passes over the problems so far
    # Episodes (``episodes.max_turns`` > 1): answers per episode, the episodes whose public
    # tests passed before their last turn, and the share of completion tokens that are the
    # environment's (context, no loss)
    TURNS_MEAN: Final = "data/turns/mean"
    EPISODES_PASSED_PUBLIC: Final = "data/episodes_passed_public"
    ENVIRONMENT_TOKEN_SHARE: Final = "data/environment_token_share"


class Reward:
    MEAN: Final = "reward/mean"  # over every scored completion kept (not only those trained)
    PASS_RATE: Final = "reward/pass_rate"  # sandbox errors count as failures


class Sampler:
    LOGPROB_DIFF_MEAN: Final = "sampler/logprob_diff/mean"  # |trainer - sampler| per token
    LOGPROB_DIFF_MAX: Final = "sampler/logprob_diff/max"
    KL: Final = "sampler/kl"  # KL(sampler || trainer), k3 estimator
    REFRESH_PROBE_DIFF: Final = "sampler/refresh_probe_diff"  # weight refresh check (worst)
    ENGINES: Final = "sampler/engines"  # engines that sampled (1, or every rank's)
    # pi_old / pi_sampler per token: the weights applied (truncated, or 0 past the decoupled
    # loss's cap), the largest ratio, and the share of tokens past the cap
    IS_WEIGHT_MEAN: Final = "sampler/is_weight/mean"
    IS_RATIO_MAX: Final = "sampler/is_ratio/max"
    IS_TRUNCATED_FRACTION: Final = "sampler/is_truncated_fraction"


class Update:
    ROLLOUTS: Final = "update/rollouts"  # rows given to the update
    REWARD_MEAN: Final = "update/reward/mean"  # over those rows
    TRAINED_FRACTION: Final = "update/trained_fraction"  # rows with a token that trains
    RESPONSE_LENGTH_MEAN: Final = "update/response_length/mean"  # tokens
    RESPONSE_LENGTH_MAX: Final = "update/response_length/max"
    TRUNCATED_FRACTION: Final = "update/truncated_fraction"  # cut at max_tokens
    LOSS: Final = "update/loss"  # the minimised total
    POLICY_LOSS: Final = "update/policy_loss"
    ENTROPY: Final = "update/entropy"
    CLIPFRAC_LOW: Final = "update/clipfrac_low"
    CLIPFRAC_HIGH: Final = "update/clipfrac_high"
    APPROX_KL: Final = "update/approx_kl"  # KL(old || new) over the steps
    RATIO_MEAN: Final = "update/ratio/mean"
    KL_REF: Final = "update/kl_ref"  # KL to the reference model
    KL_COEF: Final = "update/kl_coef"  # the coefficient this update used
    VALUE_LOSS: Final = "update/value_loss"  # ppo
    VF_CLIPFRAC: Final = "update/vf_clipfrac"  # ppo
    VALUE_MEAN: Final = "update/value/mean"  # ppo
    EXPLAINED_VARIANCE: Final = "update/explained_variance"  # ppo
    GRAD_NORM: Final = "update/grad_norm"  # before clipping
    OPTIMIZER_STEPS: Final = "update/optimizer_steps"
    EARLY_STOPPED: Final = "update/early_stopped"  # target_kl ended the update
    SKIPPED: Final = "update/skipped"  # no informative group: weights unchanged


class Queue:
    """The asynchronous loop's: a row's staleness is the trainer's policy version (the
    iteration's, minus one) minus the version that sampled it."""

    ROWS_STALE: Final = "queue/rows_stale"  # dropped as more than max_staleness versions old
    GROUPS_DEQUEUED: Final = "queue/groups_dequeued"  # taken off the queue so far (resume)
    ROUNDS_WAITING: Final = "queue/rounds_waiting"  # sampled ahead, not yet opened
    SAMPLER_RESTARTS: Final = "queue/sampler_restarts"  # the sampler's process, in this run


class Time:
    SAMPLE: Final = "time/sample_s"
    SCORE: Final = "time/score_s"
    UPDATE: Final = "time/update_s"
    SAVE: Final = "time/save_s"
    REFRESH: Final = "time/refresh_s"
    # Asynchronous: the trainer waiting for the sampler's rounds (a phase of its iteration), and
    # the sampler waiting for weights new enough, before the rounds this iteration opened
    TRAINER_IDLE: Final = "time/trainer_idle_s"
    SAMPLER_IDLE: Final = "time/sampler_idle_s"
    PHASES: Final = (SAMPLE, SCORE, UPDATE, SAVE, REFRESH, TRAINER_IDLE)


# Over an update's optimizer steps, these take the largest value; the others the mean.
MAXIMA: Final = frozenset({Sampler.LOGPROB_DIFF_MAX, Sampler.IS_RATIO_MAX})
# The metrics of pipeline.rl.algorithms' loss functions, by their local names.
IS_WEIGHT_METRICS: Final = {
    "is_weight_mean": Sampler.IS_WEIGHT_MEAN,
    "is_ratio_max": Sampler.IS_RATIO_MAX,
    "is_truncated_fraction": Sampler.IS_TRUNCATED_FRACTION,
}
POLICY_LOSS_METRICS: Final = {
    "clipfrac_low": Update.CLIPFRAC_LOW,
    "clipfrac_high": Update.CLIPFRAC_HIGH,
    "approx_kl": Update.APPROX_KL,
    "ratio_mean": Update.RATIO_MEAN,
    **IS_WEIGHT_METRICS,  # the decoupled loss weighs by them itself
}


def loss_metric(name: str) -> str:
    """A metric a policy loss returns: its documented name, or, for one of a user's own loss
    (``policy_loss: {name: custom}``), ``update/loss/<name>`` (mean over tokens)."""
    return POLICY_LOSS_METRICS.get(name, f"update/loss/{name}")


def reward_component(name: str) -> str:
    """The mean of one reward component (test, format, syntax, length, forbidden)."""
    return f"reward/{name}/mean"


def status_count(status: str) -> str:
    """How many completions the verifier gave ``status`` (passed, failed, timeout...)."""
    return f"data/status/{status}"


def staleness_count(staleness: int) -> str:
    """How many rows the update trained on were ``staleness`` policy versions old (0 to
    ``max_staleness``: the histogram of the asynchronous loop)."""
    return f"queue/staleness/{staleness}"


DECLARED: Final = frozenset(
    value
    for namespace in (Data, Reward, Sampler, Update, Queue, Time)
    for name, value in vars(namespace).items()
    if name.isupper() and isinstance(value, str)
) | {ITERATION}
_FAMILIES = re.compile(r"reward/[a-z_]+/mean|data/status/[a-z_]+|queue/staleness/[0-9]+")


def is_declared(name: str) -> bool:
    return name in DECLARED or _FAMILIES.fullmatch(name) is not None
