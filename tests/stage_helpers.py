"""For the stage tests: tiny random models saved as model folders, tiny problems, hand-built
scored rollouts and the pairs mined from them, a small RL run."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any

from datasets import Dataset
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages.pairs import PairMiningConfig, run_pair_mining
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.verifiers import RewardConfig

# A length penalty past a tiny budget varies within every group: there is always a signal.
SIGNAL = ScoreConfig(
    workers=2,
    timeout_s=3.0,
    reward=RewardConfig(
        weights={"test": 1.0, "length": 1.0}, params={"length": {"budget": 1, "buffer": 200}}
    ),
)

# A chat template in the tokenizer's own characters, so chat-style prompts work on tiny models.
CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)

TINY_PROBLEMS = [
    {
        "task_id": 1,
        "text": "Add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3"],
    },
    {
        "task_id": 2,
        "text": "Double a number.",
        "code": "def double(x):\n    return 2 * x",
        "test_list": ["assert double(3) == 6"],
    },
    {
        "task_id": 3,
        "text": "Negate a number.",
        "code": "def neg(x):\n    return -x",
        "test_list": ["assert neg(3) == -3"],
    },
]


def save_tiny_model(folder: Path, seed: int = 0) -> ModelConfig:
    """A random tiny Llama and a character tokenizer with a chat template, saved in ``folder``."""
    tokenizer = char_tokenizer(string.printable)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = tiny_causal_lm(len(tokenizer), seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return ModelConfig(name_or_path=str(folder))


def tiny_problem_set(folder: Path) -> ProblemSet:
    """:data:`TINY_PROBLEMS` as an MBPP-style file."""
    path = folder / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in TINY_PROBLEMS))
    return ProblemSet(source=str(path), split="all")


GOOD_LONG = "```python\ndef f(x):\n    y = x + 1\n    return y\n```"
GOOD_LONG_COPY = "```python\ndef f(x):  # add one\n\n    y = x+1\n    return y\n```"
GOOD_SHORT = "```python\ndef f(x):\n    return x + 1\n```"
SYNTAX = "```python\ndef f(x) return x\n```"
WRONG = "```python\ndef f(x):\n    return x\n```"
CRASH = "```python\ndef f(x):\n    raise RuntimeError\n```"


def rollout(
    prompt_id: str,
    completion: str,
    passed: bool,
    reward: float | None,
    status: str = "",
    excluded: bool = False,
) -> dict[str, Any]:
    """One row of the scored-rollouts contract, plus a column mining must ignore."""
    return {
        "prompt_id": prompt_id,
        "group_index": 0,
        "prompt": f"<user>task {prompt_id}\n<assistant>",
        "completion": completion,
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4],
        "sampling_logprobs": [-0.1, -0.2],
        "finish_reason": "stop",
        "sampler": "test",
        "policy_version": 0,
        "temperature": 1.0,
        "top_p": 1.0,
        "completion_style": "chat",
        "reward": math.nan if reward is None else reward,
        "passed": passed,
        "status": status or ("passed" if passed else "failed"),
        "pass_fraction": 1.0 if passed else 0.0,
        "excluded": excluded,
        "unrelated_extra": "ignored",
    }


def mixed_group(prompt_id: str) -> list[dict[str, Any]]:
    return [
        rollout(prompt_id, GOOD_LONG, True, 1.0),
        rollout(prompt_id, GOOD_SHORT, True, 0.9),
        rollout(prompt_id, GOOD_LONG_COPY, True, 1.0),
        rollout(prompt_id, SYNTAX, False, 0.0, "syntax_error"),
        rollout(prompt_id, WRONG, False, 0.2),
        rollout(prompt_id, CRASH, False, None, "sandbox_error", excluded=True),
    ]


def write_rollouts(path: Path, rows: list[dict[str, Any]]) -> Path:
    Dataset.from_list(rows).to_parquet(str(path))
    return path


def mined_pairs(folder: Path) -> Path:
    """Pairs mined from four :func:`mixed_group` prompts, one of them held out, in ``folder``."""
    rows = [row for i in range(4) for row in mixed_group(f"p{i}")]
    rollouts = write_rollouts(folder / "rollouts.parquet", rows)
    config = PairMiningConfig(held_out_fraction=0.25)
    pairs = run_pair_mining(config, rollouts, folder / "pairs").path
    assert pairs is not None
    return pairs


def small_rl_config(model: ModelConfig, engine: EngineConfig) -> RLConfig:
    """Two GRPO iterations of 2 prompts x 3 completions (of 12 tokens), continuation prompts,
    one sampling round each (dynamic sampling off: the tests count samples)."""
    return RLConfig(
        model=model,
        problems=ProblemSet(limit=3),
        prompt_style="continuation",
        iterations=2,
        prompts_per_iteration=2,
        dynamic_sampling=False,
        sampling=SamplingConfig(num_generations=3, max_tokens=12),
        engine=engine,
        scoring=SIGNAL,
        update=UpdateConfig(learning_rate=1e-2, sampler_is_cap=2.0),
    )
