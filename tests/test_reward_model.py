"""The reward-model stage (Bradley-Terry on the verifier's pairs, measured on problems it did
not train on), its scores as a learned reward term in scoring and RL, and best-of-n with it."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from engines import saved_tiny_model
from pydantic import ValidationError
from reward_model_helpers import (
    failing,
    passing,
    signal_rollouts,
    small_reward_model_config,
    trained_reward_model,
)
from stage_helpers import SIGNAL, rollout, small_rl_config, write_rollouts
from tiny_models import char_tokenizer, next_token_lm
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from codepost.pipeline.checkpoints.manifest import read_manifest, verify
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.model_config import load_tokenizer
from codepost.pipeline.reporting.rerank import (
    RERANK_FILE,
    BestOfN,
    RerankConfig,
    best_of_n,
    rerank,
)
from codepost.pipeline.reward_models import LearnedReward, RewardModelScorer, add_learned_rewards
from codepost.pipeline.stages import reward_model as stage
from codepost.pipeline.stages.evaluation import EvalConfig, run_evaluate
from codepost.pipeline.stages.rl import METRICS_FILE, run_rl
from codepost.pipeline.stages.scoring import ScoreConfig, summarize


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_reward_model(tmp_path_factory.mktemp("reward-model"))


def no_training(*args: object, **kwargs: object) -> None:
    raise AssertionError("the stage trained")


def test_stage_trains_on_some_problems_and_ranks_the_others_samples_by_their_verdicts(
    reward_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verify(reward_model) == []
    metrics = read_manifest(reward_model).metrics
    counts, held_out = metrics["counts"], metrics["held_out"]
    # 12 problems with pairs: 30% (4) held out whole, with the one whose only sample fails
    trained = set(metrics["train_problems"])
    assert len(trained) == 8 and "all-fail" not in trained
    assert counts["held_out_problems"] == 5 and counts["held_out_problems_with_pairs"] == 4
    assert counts["train_pairs"] == 8 * 3 * 3 and counts["pairs_too_long"] == 0
    assert counts["prompts_all_failed"] == 1
    assert (held_out["problems"], held_out["samples"], held_out["pairs"]) == (5, 25, 4 * 3 * 3)
    # "+" passes and "-" fails in every problem: unseen problems are ranked without a miss
    assert held_out["pairwise_accuracy"] == held_out["auroc"] == 1.0
    assert held_out["pairwise_p_value"] == 2 / 2**4  # the exact sign-flip test's smallest
    bins = held_out["calibration"]
    assert sum(b["samples"] for b in bins) == 25
    assert bins[0]["pass_rate"] == 0.0 and bins[-1]["pass_rate"] == 1.0
    # A rerun finds it published and trains nothing.
    monkeypatch.setattr(stage, "reward_trainer", no_training)
    assert trained_reward_model(reward_model.parent) == reward_model


def test_the_checkpoint_loads_with_plain_transformers_and_scores_as_the_scorer(
    reward_model: Path,
) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(reward_model)
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    prompt, completion = "task p0\n", passing(0, 0)
    inputs = tokenizer(prompt + completion + tokenizer.eos_token, return_tensors="pt")
    with torch.no_grad():
        plain = model(**inputs).logits[0, 0].item()
    scorer = RewardModelScorer.load(str(reward_model))
    assert scorer.max_length == 128  # as it trained
    [score] = scorer.score([prompt], [completion])
    assert score == pytest.approx(plain, abs=1e-5)


def test_the_trainer_minimises_the_bradley_terry_loss_of_the_scorers_scores(
    tmp_path: Path,
) -> None:
    """-log sigma(r(x, y_w) - r(x, y_l)) (seed 001, 2.1) plus TRL's centring term, with r the
    scorer's: training and scoring read the same tokens (EOS appended, EOS also padding)."""
    config = small_reward_model_config(tmp_path)
    tokenizer = load_tokenizer(config.model)
    prompts = ["task a\n", "task bb\n", "task c\n"]
    chosen = [passing(1, 0), passing(22, 1), passing(3, 2) + "\n\n"]
    rejected = [failing(1, 0), failing(2, 1) + "  ", failing(333, 2)]
    pairs = Dataset.from_list(
        [
            {"prompt": p, "chosen": c, "rejected": r}
            for p, c, r in zip(prompts, chosen, rejected, strict=True)
        ]
    )
    trainer = stage.reward_trainer(config, pairs, tokenizer, tmp_path / "trainer")
    with torch.no_grad(), torch.random.fork_rng():  # a head that is not ~0 everywhere
        torch.manual_seed(1)
        for parameter in trainer.model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch).item()
    scorer = RewardModelScorer(trainer.model, tokenizer, config.training.max_length)
    r_w = torch.tensor(scorer.score(prompts, chosen, batch_size=2))
    r_l = torch.tensor(scorer.score(prompts, rejected, batch_size=3))
    assert (r_w - r_l).abs().min() > 1e-3
    expected = -F.logsigmoid(r_w - r_l).mean() + 0.01 * ((r_w + r_l) ** 2).mean()
    assert loss == pytest.approx(expected.item(), abs=1e-5)


def test_too_few_pairs_are_refused_before_training_naming_the_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = signal_rollouts(problems=2)
    rows += [rollout(f"pass{i}", passing(i, 0), True, 1.0) for i in range(3)]
    rows += [rollout(f"fail{i}", failing(i, 0), False, 0.0) for i in range(3)]
    scored = write_rollouts(tmp_path / "scored.parquet", rows)
    config = small_reward_model_config(tmp_path, min_pairs=64)
    monkeypatch.setattr(stage, "reward_trainer", no_training)
    with pytest.raises(ValueError) as refused:
        stage.run_reward_model(config, scored, tmp_path / "rm")
    assert str(refused.value).startswith(
        f"reward-model: {scored} gives 9 training pairs (min_pairs 64) and 1 held-out problems "
        "with a pass and a fail (min_held_out_problems 2): of its 9 problems 2 have a pair, 3 "
        "only passing and 4 only failing samples"
    )
    assert not (tmp_path / "rm").exists()
    with pytest.raises(ValidationError, match="LoRA is not supported"):
        small_reward_model_config(tmp_path / "lora", model={"name_or_path": "x", "lora_r": 4})


def test_a_learned_term_adds_its_column_and_its_weighted_score(reward_model: Path) -> None:
    rows = [
        rollout("p0", passing(0, 1), True, 1.0),
        rollout("p0", failing(0, 1), False, 0.25),
        rollout("p0", failing(0, 2), False, None, "sandbox_error", excluded=True),
    ]
    learned = {"rm": LearnedReward(reward_model=str(reward_model), weight=0.5)}
    out = add_learned_rewards(rows, learned)
    scores = RewardModelScorer.load(str(reward_model)).score(
        [r["prompt"] for r in rows[:2]], [r["completion"] for r in rows[:2]]
    )
    assert [r["reward_rm"] for r in out[:2]] == pytest.approx(scores, abs=1e-5)
    assert [r["reward"] for r in out[:2]] == pytest.approx(
        [1.0 + 0.5 * scores[0], 0.25 + 0.5 * scores[1]], abs=1e-5
    )
    assert scores[0] > scores[1]
    assert math.isnan(out[2]["reward"]) and math.isnan(out[2]["reward_rm"])
    assert rows[0]["reward"] == 1.0 and "reward_rm" not in rows[0]  # the input is left alone
    summary = summarize(out)
    assert summary["reward/rm/mean"] == pytest.approx(sum(scores) / 2, abs=1e-5)


def test_a_learned_term_may_not_take_a_verifier_terms_name(reward_model: Path) -> None:
    with pytest.raises(ValidationError, match=r"learned reward \['format'\]"):
        ScoreConfig(learned={"format": {"reward_model": str(reward_model)}})
    with pytest.raises(ValidationError, match="reward_model"):
        ScoreConfig(learned={"rm": {"weight": 1.0}})


@pytest.mark.slow
@pytest.mark.docker
def test_rl_on_a_learned_reward_logs_it_beside_the_tests_pass_rate(
    reward_model: Path, tmp_path: Path
) -> None:
    """The learned term in the real loop: sampled, run in the sandbox, scored by the reward
    model, updated; each iteration's metrics hold the learned reward and the pass rate."""
    policy = saved_tiny_model(tmp_path / "policy")
    learned = {"rm": LearnedReward(reward_model=str(reward_model), weight=2.0)}
    scoring = SIGNAL.model_copy(update={"learned": learned})
    config = small_rl_config(policy, EngineConfig(backend="hf")).model_copy(
        update={"scoring": scoring}
    )
    out = tmp_path / "rl"
    run_rl(config, out)
    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["reward/rm/mean"]) and 0 <= row["reward/pass_rate"] <= 1
        assert row["reward/mean"] == pytest.approx(
            row["reward/test/mean"] + row["reward/length/mean"] + 2.0 * row["reward/rm/mean"],
            abs=1e-6,
        )
    scored = Dataset.from_parquet(str(out / "rollouts" / "iteration-0002.parquet"))
    assert set(scored["reward_rm"]) and all(math.isfinite(x) for x in scored["reward_rm"])


def sampled_row(task: str, passed: bool, logprobs: list[float]) -> dict:
    return {"prompt_id": task, "passed": passed, "sampling_logprobs": logprobs}


def test_best_of_n_compares_each_pick_on_the_same_problems() -> None:
    rows = [
        # a: the likelihood prefers the failing sample, the reward model the passing one
        sampled_row("a", False, [-0.1, -0.1]),
        sampled_row("a", True, [-1.0, None, -2.0]),
        sampled_row("a", False, [-3.0]),
        # b: both pick the passing one; c: none passes; d: a tie goes to the earliest sample
        sampled_row("b", True, [-0.2]),
        sampled_row("b", False, [-0.9]),
        sampled_row("c", False, [-0.5]),
        sampled_row("c", False, [-0.6]),
        sampled_row("d", False, [-0.3]),
        sampled_row("d", True, [-0.3]),
    ]
    scores = [0.0, 2.0, 1.0, 5.0, -5.0, 0.0, 1.0, 0.7, 0.7]
    # a sample the sandbox failed on is no candidate, however the reward model scores it
    lost = {**sampled_row("c", False, [-0.01]), "status": "sandbox_error"}
    rows, scores = [*rows, lost, {**lost, "prompt_id": "e"}], [*scores, 9.0, 9.0]
    result = best_of_n(rows, scores, "rm", left_out=2)
    picked = {task: p.picked for task, p in result.per_problem.items()}
    assert picked == {
        "a": {"likelihood": False, "reward-model": True, "oracle": True},
        "b": {"likelihood": True, "reward-model": True, "oracle": True},
        "c": {"likelihood": False, "reward-model": False, "oracle": False},
        "d": {"likelihood": False, "reward-model": False, "oracle": True},
    }
    pass_at_1 = {name: pick.pass_at_1 for name, pick in result.picks.items()}
    assert pass_at_1 == pytest.approx(
        {
            "random": (1 / 3 + 1 / 2 + 0 + 1 / 2) / 4,
            "likelihood": 0.25,
            "reward-model": 0.5,
            "oracle": 0.75,
        }
    )
    assert (result.problems, result.samples, result.left_out_trained) == (4, 9, 2)
    against_oracle = result.comparisons["reward-model - oracle"]
    assert against_oracle.difference == pytest.approx(-0.25)
    assert against_oracle.p_value == 1.0  # one problem differs: 2 sign patterns of 2
    assert result.comparisons["reward-model - likelihood"].difference == pytest.approx(0.25)
    assert result.comparisons["reward-model - random"].difference == pytest.approx(
        0.5 - pass_at_1["random"]
    )


def test_rerank_counts_only_problems_the_reward_model_did_not_train_on(
    reward_model: Path, tmp_path: Path
) -> None:
    rows = [{**row, "sampling_logprobs": [-1.0]} for row in signal_rollouts()]
    result = rerank(RerankConfig(reward_model=str(reward_model)), rows, tmp_path / RERANK_FILE)
    assert (result.left_out_trained, result.problems) == (8, 5)
    assert set(result.per_problem) == {row["prompt_id"] for row in rows} - set(
        read_manifest(reward_model).metrics["train_problems"]
    )
    # 4 problems where half the samples pass, 1 where none does; the model finds the "+" ones
    assert result.picks["reward-model"].pass_at_1 == result.picks["oracle"].pass_at_1 == 0.8
    assert result.picks["random"].pass_at_1 == pytest.approx(0.4)
    written = BestOfN.model_validate_json((tmp_path / RERANK_FILE).read_text())
    assert written == result
    seen = [row for row in rows if row["prompt_id"] not in result.per_problem]
    with pytest.raises(ValueError, match="trained on all 8 problems"):
        rerank(RerankConfig(reward_model=str(reward_model)), seen, tmp_path / "seen.json")


def test_rerank_scores_only_problems_where_the_pick_can_differ(
    reward_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{**row, "sampling_logprobs": [-1.0]} for row in signal_rollouts()]
    rows += [
        {**rollout("all-pass", passing(98, variant), True, 1.0), "sampling_logprobs": [-1.0]}
        for variant in range(2)
    ]
    scored: list[str] = []
    score = RerankConfig.score

    def counted(self: RerankConfig, batch: list[dict]) -> list[float]:
        scored.extend(row["prompt_id"] for row in batch)
        return score(self, batch)

    monkeypatch.setattr(RerankConfig, "score", counted)
    result = rerank(RerankConfig(reward_model=str(reward_model)), rows, tmp_path / RERANK_FILE)
    # 4 held-out problems of 3 passing and 3 failing samples; all-fail and all-pass unscored
    assert sorted(set(scored)) == sorted(set(result.per_problem) - {"all-fail", "all-pass"})
    assert len(scored) == 4 * 6
    assert result.per_problem["all-pass"].picked == dict.fromkeys(
        ("likelihood", "reward-model", "oracle"), True
    )
    assert result.per_problem["all-fail"].picked == dict.fromkeys(
        ("likelihood", "reward-model", "oracle"), False
    )
    assert result.picks["reward-model"].pass_at_1 == result.picks["oracle"].pass_at_1 == 5 / 6


def test_rerank_needs_sampled_completions() -> None:
    with pytest.raises(ValidationError, match="needs sampled: true"):
        EvalConfig(rerank={"reward_model": "rm"})


@pytest.mark.docker
def test_an_evaluation_reranks_its_sampled_completions(reward_model: Path, tmp_path: Path) -> None:
    """The real evaluation stage: a tiny model samples, the sandbox scores, the reward model
    reranks; rerank.json's counts are the evaluation's own."""
    tokenizer = char_tokenizer(string.printable)
    next_token_lm(tokenizer, {" ": "1"}).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    config = EvalConfig(
        problems=ProblemSet(limit=3),
        prompt_style="continuation",
        greedy=False,
        sampled=True,
        sampling=SamplingConfig(num_generations=3, temperature=1.5, max_tokens=8),
        ks=[1],
        engine=EngineConfig(backend="hf"),
        scoring=ScoreConfig(workers=2),
        rerank=RerankConfig(reward_model=str(reward_model)),
    )
    run_evaluate(config, str(tmp_path / "policy"), tmp_path / "eval")
    result = BestOfN.model_validate_json((tmp_path / "eval" / RERANK_FILE).read_text())
    per_problem = [
        json.loads(line)
        for line in (tmp_path / "eval" / "per_problem.jsonl").read_text().splitlines()
    ]
    assert {row["task_id"]: (row["n"], row["passed"]) for row in per_problem} == {
        task: (p.samples, p.passed) for task, p in result.per_problem.items()
    }
    assert result.left_out_trained == 0 and result.samples == 9
    assert result.picks["oracle"].pass_at_1 >= result.picks["reward-model"].pass_at_1
