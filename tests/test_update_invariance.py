"""The update's gradient does not depend on how a minibatch is split: micro-batch size 1 vs 4,
one process vs two (DDP over gloo on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from update_cases import minibatch_gradients, tiny_case, weights

from codepost.pipeline.rl.policy_update import UpdateConfig

REPO = Path(__file__).resolve().parents[1]
# accelerate's console script beside this interpreter (the project's virtual environment)
ACCELERATE = Path(sys.executable).with_name("accelerate")

CASES = {
    "grpo-token-mean": {"algorithm": "grpo", "loss_agg_mode": "token-mean"},
    "grpo-seq-mean-token-sum+kl": {
        "algorithm": "grpo",
        "loss_agg_mode": "seq-mean-token-sum",
        "kl_in": "loss",
        "kl_coef": 0.1,
        "entropy_coef": 0.01,
    },
    "rloo-seq-mean-token-mean": {"algorithm": "rloo", "loss_agg_mode": "seq-mean-token-mean"},
    "ppo-kl-in-reward": {"algorithm": "ppo", "kl_in": "reward", "kl_coef": 0.05},
}
# A reference other than the starting policy: at policy == reference the KL term's gradient is
# float noise (ref logprobs come from forwards of other shapes), so a mis-scaled KL term would go
# unseen, and Adam turns that noise into up to a full lr step on a coordinate whose gradient is
# otherwise exactly 0 (a zero-advantage row's tokens).
REFERENCE = {"reference_seed": 1}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    assert any(g.abs().max() > 0 for g in a.values()), (
        "all-zero gradient: the test would be vacuous"
    )
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=atol, msg=name)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], lr: float) -> None:
    """Weights after several Adam steps. Adam divides by sqrt(v): on coordinates whose gradient
    is ~0, float noise moves the step by a fraction of ``lr``, so the tolerance scales with
    ``lr``. A different minibatch composition or a missed step moves weights by ~``lr``."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0.05 * lr, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_micro_batch_size_does_not_change_the_gradient(case):
    grads = {}
    for micro in (1, 4):
        config = UpdateConfig(**CASES[case], micro_batch_size=micro, drop_uniform_groups=False)
        updater, batch = tiny_case(config, **REFERENCE)
        grads[micro] = minibatch_gradients(updater, batch)
    assert_same(grads[1], grads[4], atol=1e-6)


def test_micro_batch_size_does_not_change_a_full_multi_step_update():
    """Epochs x shuffled minibatches with old logprobs and clipping: same weights, same metrics."""
    results = {}
    for micro in (1, 4):
        config = UpdateConfig(
            learning_rate=1e-2,
            epochs=2,
            minibatch_size=8,
            micro_batch_size=micro,
            policy_loss={"name": "vanilla", "clip_high": 0.28},
        )
        updater, batch = tiny_case(config)
        metrics = updater.update(batch)
        results[micro] = (weights(updater), metrics)
    assert results[1][1]["update/optimizer_steps"] == results[4][1]["update/optimizer_steps"] > 1
    for name in (
        "update/loss",
        "update/policy_loss",
        "update/approx_kl",
        "update/clipfrac_low",
        "update/clipfrac_high",
        "update/entropy",
    ):
        assert results[1][1][name] == pytest.approx(results[4][1][name], rel=1e-4, abs=1e-7)
    assert_same_weights(results[1][0], results[4][0], lr=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["grpo-seq-mean-token-sum+kl", "ppo-kl-in-reward"])
def test_two_processes_give_the_gradient_and_weights_of_one(case, tmp_path):
    # 18 rollouts, 15 after dropping uniform groups: minibatches of 5 over 2 ranks in
    # micro-batches of 2 give rank 0 rows (2, 1) and rank 1 rows (2) plus a zero-weight
    # placeholder, as DDP needs the same number of backwards on every rank.
    config = UpdateConfig(
        **CASES[case], learning_rate=1e-3, epochs=2, minibatch_size=5, micro_batch_size=2
    )
    case_kwargs = {"num_prompts": 6, "group_size": 3, **REFERENCE}
    command = [
        str(ACCELERATE),
        "launch",
        "--multi_gpu",
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        "--main_process_port=0",
        str(REPO / "tests/update_cases.py"),
        config.model_dump_json(),
        str(tmp_path),
        json.dumps(case_kwargs),
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "world.txt").read_text() == "2"

    updater, batch = tiny_case(config, **case_kwargs)
    single_grads = minibatch_gradients(updater, batch)
    updater.optimizer.zero_grad(set_to_none=True)
    single_metrics = updater.update(batch)

    assert_same(torch.load(tmp_path / "grads.pt"), single_grads, atol=1e-6)
    assert_same_weights(torch.load(tmp_path / "weights.pt"), weights(updater), lr=1e-3)
    ddp_metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert single_metrics["update/trained_fraction"] == pytest.approx(15 / 18)
    assert ddp_metrics["update/optimizer_steps"] == single_metrics["update/optimizer_steps"] == 6
    for name in (
        "update/loss",
        "update/policy_loss",
        "update/approx_kl",
        "update/entropy",
        "update/kl_ref",
        "update/grad_norm",
    ):
        assert ddp_metrics[name] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-7), name
    print(f"\n[{case}] 1 vs 2 processes: metrics", {k: round(v, 6) for k, v in ddp_metrics.items()})
