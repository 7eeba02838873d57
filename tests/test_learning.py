"""Each algorithm raises the verifier reward of a tiny random model on a synthetic code task.

The loop is the production one in miniature: sample G completions per prompt -> rollout rows
(as a ``datasets.Dataset``) -> reward from the sandboxed verifier -> update. Only the
``code_reward_fn`` fixture knows how completions are scored.

Training runs until the reward has risen by ``MIN_GAIN``, checked every ``CHECK_EVERY`` steps,
for ``MAX_STEPS`` at most: another CPU's floating-point path draws other samples, and may take
more steps to get there; the criterion stays the same.
"""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.data.prompts import Prompt
from codepost.pipeline.inference.generate import generate_rollouts
from codepost.pipeline.rl.batches import collate_rollouts
from codepost.pipeline.rl.models import ValueModel
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig
from codepost.sandbox import Limits
from codepost.verifiers import Problem, RewardConfig, Verifier

PROMPT = "def f():\n    return "
ALPHABET = "def():\n rtun0123456789+"
PROMPTS_PER_STEP = 4
GROUP_SIZE = 8
MAX_NEW_TOKENS = 3
CHECK_EVERY = 25
MAX_STEPS = 300  # the bound; each algorithm got there in 25 to 50 steps on the 2-core test machine
EVAL_SAMPLES = 256
MIN_GAIN = 0.4

CONFIGS = {
    "grpo": {"algorithm": "grpo"},
    "rloo": {"algorithm": "rloo"},
    "reinforce++": {"algorithm": "reinforce++", "kl_in": "reward", "kl_coef": 0.01},
    "a2c": {"algorithm": "a2c"},
    "ppo": {
        "algorithm": "ppo",
        "kl_in": "reward",
        "kl_coef": 0.01,
        "epochs": 2,
        "minibatch_size": 16,
        "micro_batch_size": 16,
    },
}


@pytest.fixture
def code_reward_fn(sandbox_pool):
    """The real verifier: each completion runs in the Docker sandbox as ``prompt + completion``
    against MBPP-style asserts; the reward is the fraction passed (graded, so a random model
    gets some signal: any int, then close to 7, then exactly 7)."""
    problem = Problem(
        task_id="synthetic/return-7",
        prompt=PROMPT,
        prompt_is_code=True,
        entry_point="f",
        test_list=(
            "assert isinstance(f(), int)",
            "assert abs(f() - 7) <= 3",
            "assert abs(f() - 7) <= 1",
            "assert f() == 7",
        ),
    )
    verifier = Verifier(
        sandbox_pool,
        limits=Limits(wall_time_s=2.0, cpu_time_s=2.0),
        reward_config=RewardConfig(test_reward="pass_fraction"),
        completion_style="continuation",
    )

    rewards: dict[str, float] = {}  # the verdict of a program is its own: each runs once

    def reward_fn(prompts: list[str], completions: list[str]) -> list[float]:
        new = sorted(set(completions) - rewards.keys())
        samples = [{"task_id": problem.task_id, "completion": c} for c in new]
        verdicts = verifier.verify({problem.task_id: problem}, samples)
        assert not any(v.status == "sandbox_error" for v in verdicts)
        rewards.update(zip(new, (v.reward for v in verdicts), strict=True))
        return [rewards[c] for c in completions]

    return reward_fn


@pytest.fixture
def one_thread():
    """A 64-wide model is dominated by thread synchronisation: one thread is ~10x faster on
    a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sample_rows(updater, tokenizer, prompts, *, num_generations, step=0):
    return generate_rollouts(
        updater.policy,
        tokenizer,
        [Prompt(f"step{step}-{i}", text, "continuation") for i, text in enumerate(prompts)],
        num_generations=num_generations,
        max_new_tokens=MAX_NEW_TOKENS,
        policy_version=step,
    )


def mean_reward(updater, tokenizer, reward_fn) -> float:
    rows = sample_rows(updater, tokenizer, [PROMPT], num_generations=EVAL_SAMPLES)
    rewards = reward_fn([r["prompt"] for r in rows], [r["completion"] for r in rows])
    return sum(rewards) / len(rewards)


def train(updater, tokenizer, reward_fn, steps: range) -> None:
    for step in steps:
        rows = sample_rows(
            updater, tokenizer, [PROMPT] * PROMPTS_PER_STEP, num_generations=GROUP_SIZE, step=step
        )
        rewards = reward_fn([r["prompt"] for r in rows], [r["completion"] for r in rows])
        for row, reward in zip(rows, rewards, strict=True):
            row["reward"] = reward
        updater.update(collate_rollouts(Dataset.from_list(rows)))


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("name", CONFIGS)
def test_update_raises_the_verifier_reward(name, code_reward_fn, one_thread):
    torch.manual_seed(0)
    tokenizer = char_tokenizer(ALPHABET)
    policy = tiny_causal_lm(len(tokenizer), seed=0)
    config = UpdateConfig(**{"learning_rate": 3e-3, "micro_batch_size": 32, **CONFIGS[name]})
    updater = PolicyUpdater(
        config,
        policy,
        ref_model=copy.deepcopy(policy) if config.needs_reference else None,
        critic=ValueModel.from_policy(policy) if config.needs_critic else None,
    )

    before = after = mean_reward(updater, tokenizer, code_reward_fn)
    steps = 0
    while after - before < MIN_GAIN and steps < MAX_STEPS:
        train(updater, tokenizer, code_reward_fn, range(steps, steps + CHECK_EVERY))
        steps += CHECK_EVERY
        after = mean_reward(updater, tokenizer, code_reward_fn)

    print(f"\n[{name}] mean verifier reward before={before:.3f} after={after:.3f} ({steps} steps)")
    assert after - before >= MIN_GAIN, f"+{after - before:.3f} in {steps} steps"
