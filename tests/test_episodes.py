"""Episodes of several turns as rollout rows: the environment's turns rendered by the chat
template between the model's answers, masked out of the loss; one turn is the single-turn row.

A tiny random model with SmolLM2's tokenizer (its chat template) samples through the
transformers engine; a scripted environment replies, so these run without Docker (the
execution-feedback environment has tests of its own against the sandbox)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from engines import recomputed_logprobs
from tiny_models import tiny_causal_lm
from update_cases import minibatch_gradients

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import build_prompt
from codepost.pipeline.data.rows import read_rows
from codepost.pipeline.inference.episodes import EpisodeConfig, EpisodeSampler, reply_turn
from codepost.pipeline.inference.sampling import EngineConfig, HFSampler, SamplingConfig
from codepost.pipeline.model_config import ModelConfig, load_tokenizer
from codepost.pipeline.rl.algorithms import LossInputs, get_policy_loss
from codepost.pipeline.rl.batches import collate_rollouts
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig
from codepost.verifiers import Problem
from codepost.verifiers.environments import Environment, Episode, Reply

PROBLEMS = load_problem_set(ProblemSet(limit=2))
SAMPLING = SamplingConfig(num_generations=2, max_tokens=6, temperature=1.0, seed=3)


class Scripted(Environment):
    """Replies "turn k failed" to each answer; an episode is done after ``done_after``."""

    name = "scripted"

    def __init__(self, done_after: int = 100) -> None:  # runs nothing: no executor
        self.done_after = done_after

    def reset(self, problem: Problem) -> Episode:
        return Episode(problem, observation="solve it")

    def feedback(self, episodes: Sequence[Episode], answers: Sequence[str]) -> list[Reply]:
        replies = []
        for episode, answer in zip(episodes, answers, strict=True):
            episode.answers.append(answer)
            episode.done = len(episode.answers) >= self.done_after
            observation = None if episode.done else f"Turn {len(episode.answers)} failed."
            replies.append(Reply(observation, episode.done, {"end": "passed"}))
        return replies

    def score(self, episodes: Sequence[Episode]) -> list[float]:
        return [0.0 for _ in episodes]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer and chat template, saved as a folder."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    tokenizer = load_tokenizer(ModelConfig())
    model = tiny_causal_lm(
        len(tokenizer), hidden_size=32, eos_token_id=tokenizer.eos_token_id, pad_token_id=0
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = ModelConfig(name_or_path=str(folder))
    return config, HFSampler(str(folder), config, EngineConfig(backend="hf")), tokenizer


def episodes(chat_model, environment: Environment, **config) -> tuple[list[dict], list]:
    _, sampler, tokenizer = chat_model
    prompts = [build_prompt(problem, tokenizer) for problem in PROBLEMS.values()]
    episode_sampler = EpisodeSampler(
        sampler, tokenizer, PROBLEMS, environment, EpisodeConfig(**config)
    )
    return episode_sampler.sample(prompts, SAMPLING, policy_version=2), prompts


def test_the_environments_turn_is_what_the_chat_template_puts_after_an_answer():
    tokenizer = load_tokenizer(ModelConfig())
    assert reply_turn(tokenizer, "Test 1 failed.", "```python\n") == (
        "<|im_end|>\n<|im_start|>user\nTest 1 failed.<|im_end|>\n<|im_start|>assistant\n```python\n"
    )


def test_an_episode_holds_every_turn_with_the_environments_tokens_masked(chat_model):
    _, sampler, tokenizer = chat_model
    rows, prompts = episodes(chat_model, Scripted(), max_turns=3)
    assert len(rows) == 4 and [r["group_index"] for r in rows] == [0, 1, 0, 1]
    for row in rows:
        assert row["turns"] == 3 and row["episode_end"] == "turns"
        assert len(row["answers"]) == 3 and row["completion"] == row["answers"][-1]
        assert row["observations"] == ["Turn 1 failed.", "Turn 2 failed."]
        mask, ids = row["model_mask"], row["completion_ids"]
        assert len(mask) == len(ids) == len(row["sampling_logprobs"])
        # the environment's tokens, between the answers, are the chat template's reply turns
        spans = "".join("1" if m else "0" for m in mask).strip("1").replace("1", " ").split()
        assert len(spans) == 2
        env_text = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        for observation in row["observations"]:
            assert f"user\n{observation}<|im_end|>" in env_text
        assert all(
            lp is None for lp, m in zip(row["sampling_logprobs"], mask, strict=True) if not m
        )
        # the model's tokens were sampled from exactly the context the trainer scores
        trainer = recomputed_logprobs(sampler.model, row, SAMPLING.temperature)
        model_positions = torch.tensor(mask, dtype=torch.bool)
        sampled = torch.tensor([lp for lp in row["sampling_logprobs"] if lp is not None])
        torch.testing.assert_close(sampled, trainer[model_positions], atol=1e-4, rtol=0)
        assert row["prompt_ids"] == tokenizer.encode(
            prompts[0 if row["prompt_id"] == prompts[0].task_id else 1].model_input,
            add_special_tokens=False,
        )


def test_an_episode_ends_when_the_environment_is_done_or_the_budget_is_spent(chat_model):
    done_at_once, _ = episodes(chat_model, Scripted(done_after=1), max_turns=3)
    assert {(r["turns"], r["episode_end"]) for r in done_at_once} == {(1, "passed")}
    assert all(set(r["model_mask"]) == {1} for r in done_at_once)
    no_room, _ = episodes(chat_model, Scripted(), max_turns=3, max_episode_tokens=64)
    assert {(r["turns"], r["episode_end"]) for r in no_room} == {(1, "budget")}


def scored(rows: list[dict]) -> list[dict]:
    return [{**row, "reward": float(i % 2)} for i, row in enumerate(rows)]


def test_one_turn_is_the_single_turn_row_and_its_update(chat_model):
    """Same rows but the episode columns; the same loss and gradients."""
    config, sampler, tokenizer = chat_model
    prompts = [build_prompt(problem, tokenizer) for problem in PROBLEMS.values()]
    single = sampler.sample(prompts, SAMPLING, policy_version=2)
    episode, _ = episodes(chat_model, Scripted(), max_turns=1)
    assert [{k: row[k] for k in single[0]} for row in episode] == single
    assert all(row["model_mask"] == [1] * len(row["completion_ids"]) for row in episode)

    update = UpdateConfig(drop_uniform_groups=False)
    gradients, losses = [], []
    for rows in (single, episode):
        updater = PolicyUpdater(update, sampler.model, model_config=config)
        gradients.append(minibatch_gradients(updater, collate_rollouts(scored(rows))))
        losses.append(updater.update(collate_rollouts(scored(rows)))["update/policy_loss"])
        sampler.refresh(config.resolve())  # the update moved the shared weights: back
    assert gradients[0].keys() == gradients[1].keys()
    assert all(torch.equal(gradients[0][n], gradients[1][n]) for n in gradients[0])
    assert losses[0] == losses[1]


def test_the_environments_tokens_carry_no_gradient(chat_model):
    rows, _ = episodes(chat_model, Scripted(), max_turns=2)
    batch = collate_rollouts(scored(rows))
    width = batch.completion_ids.shape[1]
    within = torch.arange(width)[None, :] < batch.completion_lengths[:, None]
    environment, model = within & (batch.model_mask == 0), batch.response_mask != 0
    assert environment.any() and model.any()
    logprobs = torch.randn(batch.completion_ids.shape, requires_grad=True)
    loss, _ = get_policy_loss("vanilla")(
        LossInputs(
            logprobs=logprobs,
            old_logprobs=logprobs.detach() + 0.1,
            advantages=torch.ones_like(logprobs),
            response_mask=batch.response_mask,
        )
    )
    loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad[environment] == 0).all() and (logprobs.grad[model] != 0).all()


def test_each_turns_answers_are_scored_once_and_an_ended_episode_keeps_its_last():
    from fake_executors import InProcessExecutor

    from codepost.pipeline.data.prompts import reference_answer
    from codepost.pipeline.stages.scoring import ScoreConfig, score_rollouts, score_turns

    task = "HumanEval/0"
    right = reference_answer(PROBLEMS[task])
    wrong, other = (f"```python\ndef f():\n    return {n}\n```" for n in (0, 1))
    episodes_rows = [
        {"prompt_id": task, "completion_style": "chat", "answers": [wrong, right]},
        {"prompt_id": task, "completion_style": "chat", "answers": [other, wrong]},
        {"prompt_id": task, "completion_style": "chat", "answers": [right]},  # ended at turn 1
    ]
    rows = [{**row, "completion": row["answers"][-1]} for row in episodes_rows]
    executor = InProcessExecutor()
    scored = score_rollouts(rows, PROBLEMS, ScoreConfig(), executor=executor)
    executor.jobs.clear()
    by_turn = score_turns(scored, PROBLEMS, ScoreConfig(), 3, executor=executor)
    assert [[row["passed"] for row in turn] for turn in by_turn] == [
        [False, False, True],
        [True, False, True],
        [True, False, True],
    ]
    assert len(executor.jobs) == 1  # `other`: every other answer is some episode's last


def test_pass_at_1_turn_by_turn_the_repair_rate_and_turn_1_against_turn_t():
    from codepost.pipeline.reporting.evaluations import turns_result

    def turn(passes: list[bool]) -> list[dict]:
        return [{"prompt_id": f"t{i}", "passed": p} for i, p in enumerate(passes)]

    first = [False] * 8 + [True] * 2
    last = [True] * 7 + [False] + [True] * 2  # 7 of the 8 first-turn failures repaired
    result = turns_result([turn(first), turn([*first[:6], True, True, False, False]), turn(last)])
    assert result.pass_at_1[0] == 0.2 and result.pass_at_1[-1] == 0.9
    assert (result.failed_first, result.repaired, result.repair_rate) == (8, 7, 7 / 8)
    assert result.repair_ci95 is not None and result.repair_ci95[0] < 7 / 8 < result.repair_ci95[1]
    assert result.first_vs_last_p == pytest.approx(2 * 0.5**7)  # McNemar: 7 gained, 0 lost


@pytest.mark.docker
def test_an_evaluation_over_turns_in_the_execution_feedback_environment(chat_model, tmp_path):
    """The real environment on the sandbox: a random model's first answers fail their public
    tests, so every episode gets a reply and a second turn; evaluation.json has each turn."""
    from codepost.pipeline.stages.evaluation import EvalConfig, run_evaluate

    config, _, _ = chat_model
    evaluation = EvalConfig(
        problems=ProblemSet(limit=2),
        sampled=True,
        sampling=SamplingConfig(num_generations=2, max_tokens=8, temperature=1.0),
        ks=[1],
        episodes=EpisodeConfig(max_turns=2, max_episode_tokens=1024),
        engine=EngineConfig(backend="hf", max_model_len=1024),
    )
    results = run_evaluate(evaluation, config.name_or_path, tmp_path)
    assert results.turns is not None and set(results.turns) == {"greedy", "sampled"}
    for turns in results.turns.values():
        assert turns.pass_at_1 == [0.0, 0.0] and turns.failed_first > 0
        assert (turns.repaired, turns.first_vs_last_p) == (0, 1.0)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {row["turns"] for row in rows} == {2} and {row["episode_end"] for row in rows} == {
        "turns"
    }
    for row in rows:  # each reply ends asking for the whole solution again
        (observation,) = row["observations"]
        assert "public test" in observation and observation.rstrip().endswith("code block."), (
            observation
        )


@pytest.mark.docker
def test_rl_trains_on_episodes_rewarded_on_their_final_answers(chat_model, tmp_path):
    """One GRPO iteration on two-turn episodes in the real environment: the rows trained are
    episodes, their environment tokens masked, and the metrics count the turns."""
    from stage_helpers import small_rl_config

    from codepost.pipeline.stages.rl import METRICS_FILE, iteration_dir, run_rl

    config, _, _ = chat_model
    rl = small_rl_config(config, EngineConfig(backend="hf", max_model_len=1024)).model_copy(
        update={
            "prompt_style": "chat",
            "iterations": 1,
            "episodes": EpisodeConfig(max_turns=2, max_episode_tokens=1024),
        }
    )
    run_rl(rl, tmp_path)
    assert (iteration_dir(tmp_path, 1) / "manifest.json").is_file()
    (metrics,) = map(json.loads, (tmp_path / METRICS_FILE).read_text().splitlines())
    assert metrics["data/turns/mean"] == 2.0 and 0 < metrics["data/environment_token_share"] < 1
    rows = read_rows(next(tmp_path.rglob("iteration-0001.parquet")))
    assert all(row["turns"] == 2 and 0 in row["model_mask"] for row in rows)


def test_rft_trains_an_episode_on_the_models_turns_only(chat_model):
    """A passing episode is a pre-tokenized example whose environment turns carry no label."""
    from datasets import Dataset

    from codepost.pipeline.stages.rft import passing_examples
    from codepost.pipeline.stages.sft import SFTStageConfig, sft_trainer

    config, _, tokenizer = chat_model
    rows, _ = episodes(chat_model, Scripted(), max_turns=2)
    passing = [{**row, "passed": True, "finish_reason": "stop"} for row in rows]
    examples = passing_examples(passing, [], max_per_problem=1)
    assert len(examples) == 2 and all(example["turns"] == 2 for example in examples)
    example = examples[0]
    row = next(r for r in passing if r["prompt_id"] == example["prompt_id"])
    assert example["input_ids"] == row["prompt_ids"] + row["completion_ids"]
    dataset = Dataset.from_list(
        [{"input_ids": e["input_ids"], "completion_mask": e["completion_mask"]} for e in examples]
    )
    trainer = sft_trainer(SFTStageConfig(model=config), dataset, tokenizer, Path("unused"))
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][0].tolist()
    trained = [label != -100 for label in labels]
    expected = [False] * len(row["prompt_ids"]) + [bool(m) for m in row["model_mask"]]
    assert trained == expected


@pytest.mark.slow
def test_vllm_continues_an_episode_from_exactly_the_tokens_the_trainer_scores():
    """SmolLM2 on vLLM's CPU engine: the second turn's tokens were sampled after the first
    answer and the environment's turn as token ids, and the trainer's logprobs of them, given
    that whole context, are the engine's."""
    from engines import TEST_ENGINE

    from codepost.pipeline.inference.engines import get_sampler
    from codepost.pipeline.model_config import load_causal_lm

    model = ModelConfig()
    tokenizer = load_tokenizer(model)
    sampler = get_sampler(model, TEST_ENGINE, checkpoint=model.resolve())
    prompts = [build_prompt(problem, tokenizer) for problem in PROBLEMS.values()]
    episode_sampler = EpisodeSampler(
        sampler,
        tokenizer,
        PROBLEMS,
        Scripted(),
        EpisodeConfig(max_turns=2, max_episode_tokens=1024),
    )
    sampling = SamplingConfig(num_generations=1, max_tokens=16, temperature=0.7)
    rows = episode_sampler.sample(prompts, sampling)
    assert [row["turns"] for row in rows] == [2, 2] and rows[0]["sampler"].startswith("vllm-")
    policy = load_causal_lm(model.model_copy(update={"name_or_path": model.resolve()}))
    for row in rows:
        trainer = recomputed_logprobs(policy, row, sampling.temperature)
        mask = torch.tensor(row["model_mask"], dtype=torch.bool)
        sampled = torch.tensor([lp for lp in row["sampling_logprobs"] if lp is not None])
        torch.testing.assert_close(sampled, trainer[mask], atol=2e-3, rtol=0)


def test_a_repair_rate_is_compared_between_checkpoints_on_the_same_problems(tmp_path, capsys):
    """Per problem, the share of first answers failed that the last turn repaired, paired
    between two evaluations where both failed some first answer."""
    from evaluation_helpers import write_evaluation

    from codepost.pipeline.evaluate_command import compare
    from codepost.pipeline.reporting.evaluations import read_per_problem

    failed, repaired, kept = [False, False], [False, True], [True, True]
    before = {f"t{i}": [failed, failed, kept] for i in range(6)}
    after = {f"t{i}": [repaired, repaired, kept] for i in range(6)}
    a = write_evaluation(tmp_path / "a", "sft", None, ks=(1,), episodes=before)
    b = write_evaluation(tmp_path / "b", "grpo", None, ks=(1,), episodes=after)
    (first, *_) = read_per_problem(b / "per_problem.jsonl")
    assert (first.turn_passed, first.failed_first, first.repaired) == ([1, 3], 2, 2)
    assert compare(a, b) == 0
    shown = capsys.readouterr().out
    assert "repair rate over turns" in shown
    row = next(line for line in shown.splitlines() if line.startswith("│ sampled"))
    assert "0/12" in row and "12/12" in row and "+1.0000" in row and "0.0312" in row
