"""Episodes against single turns at the same number of model tokens: where an iteration's time
goes (sampling, the environment's feedback, scoring, the update) and how fast each goes.

The embedded SmolLM2-135M-Instruct on ``--engine`` (vLLM's CPU engine by default), MBPP
training problems as chat prompts, the real execution-feedback environment on the Docker
sandbox. The episode run samples ``--samples`` episodes of up to ``--turns`` turns per
problem; the single-turn run then samples as many completions per problem as it takes to reach
the episodes' model tokens (a group of G completions: G grows), so both update on the same
number of tokens the model produced. Both score their final answers and make one policy
update (GRPO's defaults) on their rows. Prints one line per run and the ratios, and one
episode's transcript (``--transcript``: its turns, the environment's replies, the mask).

    .venv/bin/python benchmarks/episodes.py [--problems 8] [--samples 4] [--turns 3] \\
        [--max-tokens 128] [--engine vllm|hf] [--transcript]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from machine import describe

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import build_prompt
from codepost.pipeline.inference.engines import close_samplers, get_sampler
from codepost.pipeline.inference.episodes import EpisodeConfig
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer
from codepost.pipeline.rl.batches import collate_rollouts
from codepost.pipeline.rl.metric_names import Update
from codepost.pipeline.rl.policy_update import PolicyUpdater, UpdateConfig
from codepost.pipeline.stages.scoring import ScoreConfig, close_pools, score_rollouts, with_episodes
from codepost.verifiers.problems import MBPP


class Timed:
    """Adds the seconds ``method`` of ``target`` takes to ``seconds[label]``."""

    def __init__(self, seconds: dict[str, float], label: str) -> None:
        self.seconds, self.label = seconds, label

    def around(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[self.label] = self.seconds.get(self.label, 0.0) + (
                    time.perf_counter() - started
                )

        return timed


def model_tokens(rows: Sequence[dict[str, Any]]) -> int:
    return sum(sum(row.get("model_mask") or [1] * len(row["completion_ids"])) for row in rows)


def iteration(
    sampler: Any, prompts: list, problems: dict, sampling: SamplingConfig, score: ScoreConfig,
    model: ModelConfig,
) -> tuple[list[dict[str, Any]], dict[str, float]]:  # fmt: skip
    """Sample, score and update once: the scored rows and each phase's seconds."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    rows = sampler.sample(prompts, sampling)
    seconds["sampling"] = time.perf_counter() - started
    started = time.perf_counter()
    scored = score_rollouts(rows, problems, score, description="scoring final answers")
    seconds["scoring"] = time.perf_counter() - started
    policy = load_causal_lm(model)
    updater = PolicyUpdater(UpdateConfig(learning_rate=1e-6), policy, model_config=model)
    started = time.perf_counter()
    steps = updater.update(collate_rollouts(scored))[Update.OPTIMIZER_STEPS]
    seconds["update"] = time.perf_counter() - started
    print(f"  update: {steps:.0f} optimizer steps (none where every group is uniform)")
    return scored, seconds


def report(name: str, rows: list[dict[str, Any]], seconds: dict[str, float]) -> float:
    total = sum(seconds.values())
    shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in seconds.items())
    tokens = model_tokens(rows)
    print(
        f"{name:12} {len(rows):4} rows, {tokens:6} model tokens, {total:7.1f} s: "
        f"{len(rows) / total:5.2f} rows/s, {tokens / total:6.1f} model tokens/s ({shares})"
    )
    return total


def transcript(row: dict[str, Any], tokenizer: Any) -> None:
    print(f"\n--- {row['prompt_id']}: {row['turns']} turns, ended: {row['episode_end']}")
    for turn, answer in enumerate(row["answers"], start=1):
        print(f"[answer {turn}]\n{answer}")
        if turn <= len(row["observations"]):
            print(f"[environment]\n{row['observations'][turn - 1]}")
    mask = "".join(map(str, row["model_mask"]))
    runs = [(bit, len(run)) for bit, run in _runs(mask)]
    print("[mask] " + " ".join(f"{'model' if b == '1' else 'env'}:{n}" for b, n in runs))


def _runs(mask: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for bit in mask:
        if out and out[-1][0] == bit:
            out[-1] = (bit, out[-1][1] + bit)
        else:
            out.append((bit, bit))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="episodes per problem")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128, help="per turn")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--transcript", action="store_true")
    args = parser.parse_args()

    model = ModelConfig()
    model = model.model_copy(update={"name_or_path": model.resolve()})
    tokenizer = load_tokenizer(model)
    problems = load_problem_set(
        ProblemSet(source=MBPP, split="train", limit=args.problems, shuffle_seed=0)
    )
    prompts = [build_prompt(p, tokenizer) for p in problems.values()]
    engine = EngineConfig(backend=args.engine, max_model_len=2048, cpu_threads=1)
    sampling = SamplingConfig(
        num_generations=args.samples, max_tokens=args.max_tokens, temperature=0.8
    )
    score = ScoreConfig(workers=2, timeout_s=5.0)
    engine_sampler = get_sampler(model, engine)
    episodes = with_episodes(
        engine_sampler, tokenizer, problems,
        EpisodeConfig(max_turns=args.turns, max_episode_tokens=2048), score,
    )  # fmt: skip
    feedback: dict[str, float] = {}
    environment = episodes.environment  # type: ignore[attr-defined]
    environment.feedback = Timed(feedback, "feedback").around(environment.feedback)
    print(describe())
    print(
        f"{len(problems)} MBPP train problems, {args.samples} episodes each of up to "
        f"{args.turns} turns, {args.max_tokens} tokens a turn, {args.engine}"
    )
    episode_rows, phases = iteration(episodes, prompts, problems, sampling, score, model)
    phases = {
        "sampling": phases["sampling"] - feedback.get("feedback", 0.0),
        "feedback": feedback.get("feedback", 0.0),
        "scoring": phases["scoring"],
        "update": phases["update"],
    }
    episode_total = report("episodes", episode_rows, phases)
    # single turns: as many completions per problem as the episodes' model tokens take
    tokens = model_tokens(episode_rows)
    first_answers = sum(len(row["answers"][0]) for row in episode_rows) / len(episode_rows)
    per_completion = tokens / sum(row["turns"] for row in episode_rows)
    group = max(args.samples, math.ceil(tokens / len(problems) / per_completion))
    single_rows, single = iteration(
        engine_sampler, prompts, problems, sampling.model_copy(update={"num_generations": group}),
        score, model,
    )  # fmt: skip
    single_total = report("single turn", single_rows, single)
    print(f"(single turn: {group} completions a problem; first answers {first_answers:.0f} chars)")
    generating = phases["sampling"] + phases["feedback"]
    print(
        f"ratio: episodes take {episode_total / single_total:.2f}x the single-turn time for "
        f"{tokens / max(model_tokens(single_rows), 1):.2f}x its model tokens; generation alone "
        f"(sampling and feedback) {generating / single['sampling']:.2f}x "
        "(the update's time depends on how many groups have a signal)"
    )
    if args.transcript:
        longest = max(episode_rows, key=lambda row: (row["turns"], -len(row["completion_ids"])))
        transcript(longest, tokenizer)
    close_samplers()
    close_pools()


if __name__ == "__main__":
    main()
