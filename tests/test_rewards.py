"""Reward components, their weighted sum, and the TRL reward functions."""

from __future__ import annotations

import asyncio

import pytest
from fake_executors import CannedExecutor, InProcessExecutor
from pydantic import ValidationError
from trl.trainer.utils import get_callable_name, is_async_callable

from codepost.sandbox import ExecStatus, ExecutionResult
from codepost.settings.config import SettingsError, load_config
from codepost.verifiers import Problem, RewardConfig, Verifier, build_program, make_trl_reward_funcs
from codepost.verifiers.rewards import (
    TermParams,
    combine,
    find_forbidden,
    format_reward,
    length_penalty,
    syntax_reward,
    think_closed,
)
from codepost.verifiers.rewards import test_reward as score_tests  # not a pytest test

PROBLEM = Problem(
    task_id="add",
    prompt='import subprocess\n\n\ndef add(a, b):\n    """Add."""\n',
    prompt_is_code=True,
    entry_point="add",
    test="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n",
)
PROBLEMS = {PROBLEM.task_id: PROBLEM}
GOOD_CHAT = "<think>easy</think>\n```python\ndef add(a, b):\n    return a + b\n```"


def test_config_rejects_unknown_fields():
    with pytest.raises(ValidationError, match="format_wieght"):
        RewardConfig(format_wieght=1.0)
    with pytest.raises(ValidationError, match="no reward term"):
        RewardConfig(weights={"fromat": 1.0})
    with pytest.raises(ValidationError, match="budget"):
        RewardConfig(params={"length": {"budget": 0}})
    with pytest.raises(ValidationError, match="bugdet"):  # a term's own settings, by its model
        RewardConfig(params={"length": {"bugdet": 10}})
    with pytest.raises(ValidationError, match=r"unknown reward term 'lenght' \(known: "):
        RewardConfig(params={"lenght": {"budget": 10}})


def test_each_term_has_its_own_settings_and_old_spellings_name_the_new():
    config = RewardConfig(params={"length": {"budget": 10}})
    assert config.term_params("length").budget == 10 and config.term_params("length").buffer == 1024
    assert config.term_params("format").require_think is False  # left out: its defaults
    assert config.term_params("syntax") == TermParams()  # a term without settings
    dumped = config.model_dump()  # a resume key holds every setting of every term
    assert dumped["params"]["length"] == {"unit": "chars", "budget": 10, "buffer": 1024}
    assert RewardConfig.model_validate(dumped) == config
    with pytest.raises(
        SettingsError, match=r"--length-budget is renamed: use --params.length.budget"
    ):
        load_config(RewardConfig, None, [(["length-budget"], "10")])
    flagged = load_config(RewardConfig, None, [(["params", "length", "budget"], "10")])
    assert flagged.term_params("length").budget == 10


def test_test_reward_modes():
    assert score_tests(False, 0.5, "binary") == 0.0
    assert score_tests(True, 1.0, "binary") == 1.0
    assert score_tests(False, 0.5, "pass_fraction") == 0.5


@pytest.mark.parametrize(
    ("completion", "require_think", "expected"),
    [
        ("```python\nx = 1\n```", False, 1.0),
        ("Prose first.\n```\nx = 1\n```\nprose after", False, 1.0),
        ("```python\nx = 1\n```\n```python\ny = 2\n```", False, 0.0),  # two blocks
        ("```python\nx = 1\n", False, 0.0),  # never closed
        ("```python\n```", False, 0.0),  # empty
        ("```bash\nls\n```", False, 0.0),  # not Python
        ("no code at all", False, 0.0),
        ("```python\nx = 1\n```", True, 0.0),  # no think block
        (GOOD_CHAT, True, 1.0),
        ("step by step</think>```python\nx = 1\n```", True, 1.0),  # <think> was in the prompt
        ("<think>```python\na\n```</think>```python\nx = 1\n```", False, 1.0),  # think ignored
        ("<think>never closed ```python\nx = 1\n```", True, 0.0),
    ],
)
def test_format_reward(completion, require_think, expected):
    assert format_reward(completion, require_think) == expected


def test_think_closed():
    assert think_closed("<think>a</think>b")
    assert not think_closed("</think>a<think>b")
    assert not think_closed("<think>a</think><think>b</think>")


def test_syntax_reward():
    assert syntax_reward("def f():\n    return 1\n") == 1.0
    assert syntax_reward("def f(:\n") == 0.0
    assert syntax_reward(r"x = '\0'") == 1.0
    assert syntax_reward("x = 1\0") == 0.0  # null bytes: ValueError, not SyntaxError


@pytest.mark.parametrize(
    ("length", "expected"), [(0, 0.0), (100, 0.0), (125, -0.5), (150, -1.0), (10_000, -1.0)]
)
def test_length_penalty(length, expected):
    assert length_penalty(length, budget=100, buffer=50) == expected


def forbidden(completion: str, style: str = "auto") -> list[str]:
    config = RewardConfig()
    program = build_program(PROBLEM, completion, style)
    params = config.term_params("forbidden")
    return find_forbidden(program, params.imports, params.calls)


def test_forbidden_code_is_found_in_the_models_code_only():
    # the trusted prompt imports subprocess: no penalty for that
    assert forbidden("    return a + b\n") == []
    assert forbidden("    import subprocess\n    return a + b\n") == ["import subprocess"]
    assert forbidden("```python\nimport multiprocessing.pool\ndef add(a, b): pass\n```") == [
        "import multiprocessing.pool"
    ]
    assert forbidden("    return eval('a + b')\n") == ["call eval"]
    assert forbidden("    import os\n    os.system('ls')\n") == ["call os.system"]
    assert forbidden("    from os import system as run\n    run('ls')\n") == ["call os.system"]
    assert forbidden("    import sys as s\n    s.exit(0)\n") == ["call sys.exit"]
    assert forbidden("    from socket import socket\n") == ["import socket"]
    assert forbidden("    return (\n") == []  # unparsable: nothing to look at


def test_combine_weights_components():
    config = RewardConfig(weights={"test": 1.0, "format": 0.5, "length": 0.25})
    components = {"test": 1.0, "format": 1.0, "syntax": 0.0, "length": -1.0, "forbidden": -1.0}
    assert combine(config, components) == 1.0 + 0.5 - 0.25
    assert combine(config, {**components, "test": None}) is None
    assert combine(config, {**components, "syntax": None}) == 1.25  # weight 0: not needed


def test_verdict_reward_uses_the_config():
    config = RewardConfig(
        weights={"test": 1.0, "format": 0.5, "syntax": 0.1, "forbidden": 1.0},
        params={"format": {"require_think": True}},
    )
    verifier = Verifier(InProcessExecutor(), reward_config=config)
    good, cheat = verifier.verify(
        PROBLEMS,
        [
            {"task_id": "add", "completion": GOOD_CHAT},
            {
                "task_id": "add",
                "completion": "```python\ndef add(a, b):\n    return eval('a+b')\n```",
            },
        ],
    )
    assert good.reward_components == {  # length has weight 0: not computed
        "test": 1.0,
        "format": 1.0,
        "syntax": 1.0,
        "forbidden": 0.0,
    }
    assert good.reward == pytest.approx(1.6)
    assert cheat.passed
    assert cheat.reward_components["format"] == 0.0  # no think block
    assert cheat.reward == pytest.approx(1.0 + 0.1 - 1.0)


# -- TRL reward functions


def trl_kwargs(completions, task_ids, **extra):
    """What TRL 1.16's GRPOTrainer._calculate_rewards passes to a reward function."""
    return {
        "prompts": ["p"] * len(completions),
        "completions": completions,
        "completion_ids": [[0] * len(str(c)) for c in completions],
        "task_id": task_ids,
        "trainer_state": object(),
        **extra,
    }


def test_trl_reward_funcs_sum_to_the_verifier_reward():
    config = RewardConfig(weights={"test": 1.0, "format": 0.5, "syntax": 0.25, "length": 2.0})
    verifier = Verifier(InProcessExecutor(), reward_config=config)
    funcs = make_trl_reward_funcs(verifier, PROBLEMS)
    assert [get_callable_name(f) for f in funcs] == [
        "test_reward",
        "format_reward",
        "syntax_reward",
        "length_reward",
    ]
    assert not any(is_async_callable(f) for f in funcs)
    completions = [
        [{"role": "assistant", "content": GOOD_CHAT}],
        [{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a - b\n```"}],
    ]
    logged = {}
    kwargs = trl_kwargs(
        completions,
        ["add", "add"],
        log_metric=lambda name, value: logged.setdefault(name, value),
        log_extra=lambda column, values: logged.setdefault(column, values),
    )
    per_func = [f(**kwargs) for f in funcs]
    totals = [sum(rewards) for rewards in zip(*per_func, strict=True)]
    samples = [{"task_id": "add", "completion": c[0]["content"]} for c in completions]
    assert totals == pytest.approx([v.reward for v in verifier.verify(PROBLEMS, samples)])
    assert per_func[0] == [1.0, 0.0]
    assert logged == {"verifier/sandbox_errors": 0.0, "status": ["passed", "failed"]}


def test_async_trl_test_reward_is_awaitable():
    verifier = Verifier(InProcessExecutor())
    (func,) = make_trl_reward_funcs(verifier, PROBLEMS, asynchronous=True)
    assert is_async_callable(func)
    completions = ["    return a + b\n", "    return a * b\n"]
    assert asyncio.run(func(**trl_kwargs(completions, ["add", "add"]))) == [1.0, 0.0]


@pytest.mark.parametrize(("policy", "reward"), [("fail", 0.0), ("exclude", None)])
def test_trl_test_reward_of_sandbox_errors_is_a_failure_unless_excluded(policy, reward):
    verifier = Verifier(CannedExecutor(ExecutionResult(ExecStatus.SANDBOX_ERROR, error="down")))
    config = RewardConfig(sandbox_errors=policy)
    (func,) = make_trl_reward_funcs(verifier, PROBLEMS, config)
    assert func(**trl_kwargs(["    return a + b\n"], ["add"])) == [reward]


def test_trl_weights_and_token_lengths_come_from_the_given_config():
    config = RewardConfig(
        weights={"test": 0.0, "length": 3.0},
        params={"length": {"unit": "tokens", "budget": 4, "buffer": 4}},
    )
    (length,) = make_trl_reward_funcs(Verifier(InProcessExecutor()), PROBLEMS, config)
    kwargs = trl_kwargs(["x", "x"], ["add", "add"])
    kwargs["completion_ids"] = [[1] * 4, [1] * 6]
    assert length(**kwargs) == [0.0, -1.5]
    with pytest.raises(ValueError, match="every reward weight is 0"):
        make_trl_reward_funcs(
            Verifier(InProcessExecutor()), PROBLEMS, RewardConfig(weights={"test": 0})
        )


def test_pathological_code_does_not_crash_the_host():
    deep = "x = " + "-" * 200_000 + "1\n"  # the parser overflows: MemoryError, not SyntaxError
    assert syntax_reward(deep) == 0.0
    assert forbidden(deep) == []
    assert format_reward(f"```python\n{deep}```") == 1.0
