"""A user's own reward term, advantage estimator and policy loss by import path
(tests/user_plugins.py stands for the user's package): checked when the config loads, named in
errors, computed as a registered one is, seen by the resume key, and run in the real RL loop."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from engines import saved_tiny_model
from fake_executors import InProcessExecutor
from pydantic import ValidationError
from stage_helpers import SIGNAL, small_rl_config

from codepost.pipeline.inference.sampling import EngineConfig
from codepost.pipeline.rl.algorithms import AdvantageInputs, get_advantage_estimator
from codepost.pipeline.rl.update_config import UpdateConfig
from codepost.pipeline.stages.resume import named_inputs
from codepost.pipeline.stages.rl import METRICS_FILE, run_rl
from codepost.verifiers import Problem, RewardConfig, Verifier

TERM = {"import_path": "user_plugins:defines_a_function", "kwargs": {"bonus": 0.5}}
ESTIMATOR = {"name": "custom", "import_path": "user_plugins:centred_scores", "kwargs": {"scale": 2}}
LOSS = {"name": "custom", "import_path": "user_plugins:policy_gradient", "kwargs": {"coef": 1.0}}
ADD = Problem(task_id="add", prompt="def add(a, b):\n", test_list=["assert add(1, 2) == 3"])


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def test_a_custom_term_is_weighted_into_the_reward_like_a_registered_one():
    config = RewardConfig(weights={"test": 1.0, "mine": 2.0}, custom={"mine": TERM})
    verifier = Verifier(InProcessExecutor(), reward_config=config, completion_style="chat")
    right, wrong, none = verifier.verify(
        {"add": ADD},
        [
            {"task_id": "add", "completion": fenced("def add(a, b):\n    return a + b\n")},
            {"task_id": "add", "completion": fenced("def add(a, b):\n    return a - b\n")},
            {"task_id": "add", "completion": fenced("add = lambda a, b: a * b\n")},
        ],
    )
    assert [v.reward for v in (right, wrong, none)] == [2.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("term", "named"),
    [
        ({"import_path": "user_plugins.defines_a_function"}, "is not 'package.module:function'"),
        ({"import_path": "no_such_package:fn"}, "cannot import 'no_such_package'"),
        ({"import_path": "user_plugins:nothing_here"}, "'user_plugins' has no 'nothing_here'"),
        ({"import_path": "user_plugins:CALLS"}, "is a dict, not callable"),
        ({**TERM, "kwargs": {"bonsu": 1.0}}, "defines_a_function does not take .*'bonsu'"),
        ({"import_path": TERM["import_path"]}, "missing a required argument: 'bonus'"),
    ],
)
def test_a_bad_plug_in_is_refused_when_the_config_loads_naming_it(term, named):
    with pytest.raises(ValidationError, match=named):
        RewardConfig(weights={"mine": 1.0}, custom={"mine": term})


def test_a_custom_term_may_not_take_a_registered_name_and_a_weight_needs_a_term():
    with pytest.raises(ValidationError, match=r"custom reward term \['format'\]"):
        RewardConfig(custom={"format": TERM})
    with pytest.raises(ValidationError, match=r"no reward term \['mine'\]"):
        RewardConfig(weights={"mine": 1.0})


def test_a_custom_estimator_runs_with_its_kwargs():
    config = UpdateConfig(advantage=ESTIMATOR, policy_loss=LOSS)
    inputs = AdvantageInputs(
        token_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0], [3.0, 0.0]]),
        response_mask=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
        group_ids=torch.tensor([0, 0, 1]),
    )
    advantages, _ = config.estimator(inputs, config.advantage)
    expected = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)
    assert get_advantage_estimator("custom") is config.estimator


def test_a_custom_loss_takes_several_epochs_only_when_it_says_it_clips():
    with pytest.raises(ValidationError, match="'custom' has no clip"):
        UpdateConfig(policy_loss=LOSS, epochs=2)
    assert UpdateConfig(policy_loss={**LOSS, "clipped": True}, epochs=2).epochs == 2


def test_the_resume_key_sees_each_plug_ins_source(tmp_path):
    config = small_rl_config(saved_tiny_model(tmp_path / "m"), EngineConfig(backend="hf"))
    config = config.model_copy(
        update={"update": UpdateConfig(advantage=ESTIMATOR, policy_loss=LOSS)}
    )
    digests = named_inputs(config)
    source = Path(__file__).with_name("user_plugins.py").read_bytes()
    for path in (ESTIMATOR["import_path"], LOSS["import_path"]):
        assert digests[f"plug-in {path}"] == hashlib.sha256(source).hexdigest()


@pytest.mark.slow
@pytest.mark.docker
def test_rl_trains_with_a_users_term_estimator_and_loss(tmp_path):
    """The three plug-ins in the real loop: sampled, run in the sandbox, scored with the
    custom term, advantages from the custom estimator, the update through the custom loss."""
    import user_plugins

    weights = {**SIGNAL.reward.weights, "mine": 1.0}
    reward = RewardConfig(
        **{**SIGNAL.reward.model_dump(), "weights": weights, "custom": {"mine": TERM}}
    )
    scoring = SIGNAL.model_copy(update={"reward": reward})
    config = small_rl_config(saved_tiny_model(tmp_path / "policy"), EngineConfig(backend="hf"))
    config = config.model_copy(
        update={
            "scoring": scoring,
            "update": config.update.model_copy(
                update={
                    "advantage": UpdateConfig(advantage=ESTIMATOR).advantage,
                    "policy_loss": UpdateConfig(policy_loss=LOSS).policy_loss,
                }
            ),
        }
    )
    calls = user_plugins.CALLS["loss"]
    run_rl(config, tmp_path / "rl")
    rows = [json.loads(line) for line in (tmp_path / "rl" / METRICS_FILE).read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["reward/mine/mean"])
        assert row["reward/mean"] == pytest.approx(
            row["reward/test/mean"] + row["reward/length/mean"] + row["reward/mine/mean"],
            abs=1e-6,
        )
    assert user_plugins.CALLS["loss"] > calls  # the update went through the user's loss
    assert all(math.isfinite(row["update/loss/user_pg"]) for row in rows)  # and its metric
