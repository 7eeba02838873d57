"""The evaluation stage: pass@k of a checkpoint through the sampler and the sandboxed verifier.

Greedy pass@1 (one completion per problem at temperature 0) and sampled pass@k (n completions
at a temperature, the unbiased estimator of Chen et al. 2021). Sandbox errors count as
failures unless ``exclude_sandbox_errors``, and are reported either way. Writes
``evaluation.json`` (scores, counts, settings), ``per_problem.jsonl`` (each problem's counts, what
paired comparisons are made of) and ``samples.jsonl`` (every scored completion).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ...settings.config import Settings
from ..atomic import staged
from ..checkpoints.card import add_evaluation
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import PromptStyle, build_prompt
from ..inference.engines import get_sampler
from ..inference.episodes import EpisodeConfig, check_episodes
from ..inference.sampling import EngineConfig, SamplingConfig, check_room
from ..model_config import ModelConfig, load_tokenizer
from ..reporting.evaluations import (
    PER_PROBLEM_FILE,
    RESULTS_FILE,
    SAMPLES_FILE,
    EvaluationResults,
    RunResult,
    TurnsResult,
    pass_at_k_of_rows,
    turns_result,
    write_per_problem,
)
from ..reporting.rerank import RERANK_FILE, RerankConfig, rerank
from .registry import Artifacts, Stage, filtered_problem_set, register
from .scoring import ScoreConfig, score_rollouts, score_turns, with_episodes

log = logging.getLogger(__name__)


def _default_ks(data: dict[str, Any]) -> list[int]:
    """pass@1 and pass@8, where the sampled completions per problem allow them."""
    sampling = data.get("sampling")
    n = sampling.num_generations if isinstance(sampling, SamplingConfig) else 8
    return [k for k in (1, 8) if k <= n] or [1]


class EvalConfig(Settings):
    """What to evaluate on and how: greedy pass@1 and/or sampled pass@k."""

    # Spellings of earlier versions, refused with the new one's name.
    renamed: ClassVar[dict[str, str]] = {
        "num_samples": "sampled: true, with sampling.num_generations",
        "temperature": "sampling.temperature",
        "top_p": "sampling.top_p",
        "max_tokens": "sampling.max_tokens",
        "seed": "sampling.seed",
    }

    problems: ProblemSet = Field(default_factory=ProblemSet, description="default: HumanEval")
    problems_from: Literal["train", "held_out"] | None = Field(
        None,
        description="in a run: the problems a filter stage kept instead (train: those the "
        "stages after it train on; held_out: those it set aside), in `problems`' order and limit",
    )
    prompt_style: PromptStyle = "chat"
    greedy: bool = Field(
        True,
        description="greedy pass@1: one completion per problem at temperature 0 (with "
        "sampling's max_tokens, stop and seed)",
    )
    sampled: bool = Field(
        False, description="sampled pass@k: sampling.num_generations completions per problem"
    )
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(num_generations=8, temperature=0.8),
        description="how completions are drawn (vLLM takes temperatures in [0, 2])",
    )
    ks: list[int] = Field(
        default_factory=_default_ks,
        description="k of sampled pass@k; default: 1 and 8, where num_generations allows",
    )
    exclude_sandbox_errors: bool = Field(False, description="leave them out of n (reported)")
    episodes: EpisodeConfig = Field(
        default_factory=EpisodeConfig,
        description="answers over several turns, the environment's feedback between them: "
        "each run's scores are its answers after the last turn, and evaluation.json's `turns` "
        "has pass@1 after each turn, the repair rate and turn 1 against turn T",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scoring: ScoreConfig = Field(default_factory=ScoreConfig)
    rerank: RerankConfig | None = Field(
        None,
        description="best-of-n: pass@1 of the sampled completion a reward model ranks first, "
        "against a random pick, the likelihood's and the verifier's, in rerank.json",
    )

    @model_validator(mode="after")
    def _something_to_do(self) -> EvalConfig:
        if not self.greedy and not self.sampled:
            raise ValueError("nothing to evaluate: greedy=False and sampled=False")
        if self.rerank is not None and not self.sampled:
            raise ValueError("rerank picks among the sampled completions: it needs sampled: true")
        if self.sampled and self.sampling.temperature == 0:
            raise ValueError("sampled pass@k needs sampling.temperature > 0 (0 is greedy)")
        n = self.sampling.num_generations
        too_large = [k for k in self.ks if self.sampled and k > n]
        if too_large:
            raise ValueError(
                f"pass@k for k={too_large} needs sampling.num_generations >= {max(too_large)}"
            )
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        check_episodes(self.episodes, self.prompt_style, self.engine)
        return self

    def runs(self) -> dict[str, SamplingConfig]:
        """How each run samples: greedy (one completion at temperature 0) and sampled."""
        runs: dict[str, SamplingConfig] = {}
        if self.greedy:
            greedy = {"num_generations": 1, "temperature": 0.0, "top_p": 1.0}
            runs["greedy"] = self.sampling.model_copy(update=greedy)
        if self.sampled:
            runs["sampled"] = self.sampling
        return runs


def run_evaluate(config: EvalConfig, checkpoint: str, out_dir: Path) -> EvaluationResults:
    """Evaluate ``checkpoint`` (a model folder, hub id or ``embedded:...``); returns and writes
    the results. Results already in ``out_dir`` for the same checkpoint, settings and problems
    (their content: a problems file edited in place is evaluated again) are returned as they
    are (the stage is resumable)."""
    out_dir = Path(out_dir)
    done = out_dir / RESULTS_FILE
    settings = json.loads(config.model_dump_json())
    problems = load_problem_set(config.problems)
    if done.is_file():
        previous = EvaluationResults.read(done)
        made_of = (previous.checkpoint, previous.config, previous.problems_fingerprint)
        if made_of == (checkpoint, settings, fingerprint(problems)):
            add_evaluation(checkpoint, previous.to_json())  # a card written since, or lost
            return previous
    model = ModelConfig(name_or_path=checkpoint)
    tokenizer = load_tokenizer(model)
    prompts = [build_prompt(p, tokenizer, config.prompt_style) for p in problems.values()]
    sampler = with_episodes(
        get_sampler(model, config.engine), tokenizer, problems, config.episodes, config.scoring
    )
    turns = config.episodes.max_turns

    scores: dict[str, RunResult] = {}
    by_turn: dict[str, TurnsResult] = {}
    all_rows = []
    for name, sampling in config.runs().items():
        rows = sampler.sample(prompts, sampling)
        scored = score_rollouts(rows, problems, config.scoring, description=f"scoring {name}")
        if turns > 1:
            each_turn = score_turns(
                scored, problems, config.scoring, turns, description=f"scoring {name}"
            )
            by_turn[name] = turns_result(each_turn)
            scored = [
                {**row, "turn_passed": [bool(turn[i]["passed"]) for turn in each_turn]}
                for i, row in enumerate(scored)
            ]
        ks = [1] if name == "greedy" else config.ks
        errors = sum(row["status"] == "sandbox_error" for row in scored)
        scores[name] = RunResult.model_validate(
            {
                **pass_at_k_of_rows(
                    scored, ks, exclude_sandbox_errors=config.exclude_sandbox_errors
                ),
                "samples": len(scored),
                "passed": sum(bool(row["passed"]) for row in scored),
                "sandbox_errors": errors,
                "excluded_sandbox_errors": errors if config.exclude_sandbox_errors else 0,
                "temperature": sampling.temperature,
            }
        )
        all_rows += [{"run": name, **row} for row in scored]
    results = EvaluationResults(
        checkpoint=checkpoint,
        problems=config.problems.model_dump(),
        problems_fingerprint=fingerprint(problems),
        num_problems=len(problems),
        config=settings,
        turns=by_turn or None,
        **scores,
    )
    with staged(out_dir / SAMPLES_FILE) as staging, staging.open("w") as stream:
        for row in all_rows:
            stream.write(json.dumps(row) + "\n")
    write_per_problem(out_dir / PER_PROBLEM_FILE, all_rows)
    if config.rerank is not None:
        sampled_rows = [row for row in all_rows if row["run"] == "sampled"]
        rerank(config.rerank, sampled_rows, out_dir / RERANK_FILE)
    results.write(done)  # last: marks the stage finished
    log.info("evaluation of %s: %s", checkpoint, _headline(results))
    add_evaluation(checkpoint, results.to_json())  # a published checkpoint's model card
    return results


def _headline(results: EvaluationResults) -> str:
    return ", ".join(
        f"{name} pass@{k} {value:.3f}"
        for name, run in results.runs().items()
        for k, value in run.pass_at_k.items()
    )


def _stage(config: EvalConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    if inputs.checkpoint is None:
        raise ValueError("evaluate: no checkpoint to evaluate")
    if config.problems_from is not None:
        if inputs.problems is None:
            raise ValueError(f"evaluate: problems_from={config.problems_from!r} needs a filter")
        problems = filtered_problem_set(
            Path(inputs.problems).parent, config.problems, config.problems_from
        )
        config = config.model_copy(update={"problems": problems})
    run_evaluate(config, inputs.checkpoint, out_dir)
    return Artifacts(evaluation=str(out_dir))


register(
    Stage(
        name="evaluate",
        config=EvalConfig,
        run=_stage,
        needs=("checkpoint",),
        uses=("problems",),
        makes=("evaluation",),
        description="pass@k of a checkpoint, with intervals",
    )
)
