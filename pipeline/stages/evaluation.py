"""The evaluation stage: pass@k of a checkpoint through the sampler and the sandboxed verifier.

Greedy pass@1 (one completion per problem at temperature 0) and sampled pass@k (n completions
at a temperature, the unbiased estimator of Chen et al. 2021). Sandbox errors count as
failures unless ``exclude_sandbox_errors``, and are reported either way. Writes
``evaluation.json`` (scores, counts, settings) and ``samples.jsonl`` (every scored completion).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from ..atomic import staged, write_text
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import PromptStyle, build_prompt
from ..inference.sampling import EngineConfig, SamplingConfig, check_room, get_sampler
from ..model_config import ModelConfig, load_tokenizer
from ..reporting.stats import bootstrap_interval, pass_at_k_per_problem, wilson_interval
from .registry import Artifacts, Stage, register
from .scoring import ScoreConfig, score_rollouts

log = logging.getLogger(__name__)

RESULTS_FILE = "evaluation.json"
SAMPLES_FILE = "samples.jsonl"
RUNS = ("greedy", "sampled")


class EvalConfig(BaseModel):
    """What to evaluate on and how: greedy pass@1 and/or sampled pass@k."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problems: ProblemSet = Field(default_factory=ProblemSet, description="default: HumanEval")
    problems_from: Literal["train", "held_out"] | None = Field(
        None,
        description="in a run: the problems a filter stage kept instead (train: those the "
        "stages after it train on; held_out: those it set aside), in `problems`' order and limit",
    )
    prompt_style: PromptStyle = "chat"
    greedy: bool = Field(True, description="greedy pass@1")
    num_samples: int = Field(0, ge=0, le=1024, description="sampled completions per problem")
    temperature: float = Field(0.8, gt=0, le=2, description="vLLM takes [0, 2]")
    top_p: float = Field(1.0, gt=0, le=1)
    ks: list[int] = Field(default_factory=lambda: [1, 8], description="k of sampled pass@k")
    max_tokens: int = Field(384, ge=1)
    exclude_sandbox_errors: bool = Field(False, description="leave them out of n (reported)")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scoring: ScoreConfig = Field(default_factory=ScoreConfig)
    seed: int = 0

    @model_validator(mode="after")
    def _something_to_do(self) -> EvalConfig:
        if not self.greedy and not self.num_samples:
            raise ValueError("nothing to evaluate: greedy=False and num_samples=0")
        too_large = [k for k in self.ks if self.num_samples and k > self.num_samples]
        if too_large:
            raise ValueError(f"pass@k for k={too_large} needs num_samples >= {max(too_large)}")
        check_room(self.max_tokens, self.engine)
        return self


class RunResult(BaseModel):
    """One run of an evaluation (greedy or sampled): pass@k and its 95% interval for each k,
    and the counts. On disk each k is a pair of flat keys, ``pass@k`` and ``pass@k_ci95``."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    pass_at_k: dict[int, float] = Field(description="NaN where some problem has < k samples")
    ci95: dict[int, tuple[float, float] | None] = Field(default_factory=dict)
    samples: int
    passed: int
    sandbox_errors: int = 0
    excluded_sandbox_errors: int = 0
    temperature: float

    @model_validator(mode="before")
    @classmethod
    def _from_flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "pass_at_k" in data:
            return data
        data, pass_at_k, ci95 = dict(data), {}, {}
        for key in [key for key in data if key.startswith("pass@")]:
            k = key.removeprefix("pass@")
            if k.endswith("_ci95"):
                ci95[int(k.removesuffix("_ci95"))] = data.pop(key)
            else:
                pass_at_k[int(k)] = data.pop(key)
        return {**data, "pass_at_k": pass_at_k, "ci95": ci95}

    @model_serializer(mode="wrap")
    def _to_flat_keys(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        pass_at_k, ci95 = data.pop("pass_at_k"), data.pop("ci95")
        flat: dict[str, Any] = {}
        for k, value in pass_at_k.items():
            flat[f"pass@{k}"], flat[f"pass@{k}_ci95"] = value, ci95.get(k)
        return {**flat, **data}


class EvaluationResults(BaseModel):
    """What ``evaluation.json`` holds: the checkpoint, its problems and settings, and each run's
    scores. The problems and settings stay plain records, so a file written with other
    settings' fields still reads."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    checkpoint: str
    problems: dict[str, Any] = Field(default_factory=dict, description="the ProblemSet")
    problems_fingerprint: str | None = Field(None, description="hash of the problems' content")
    num_problems: int
    config: dict[str, Any] = Field(default_factory=dict, description="the EvalConfig")
    greedy: RunResult | None = None
    sampled: RunResult | None = None

    def runs(self) -> dict[str, RunResult]:
        """The runs this evaluation made, greedy first."""
        return {name: run for name in RUNS if (run := getattr(self, name)) is not None}

    def sandbox_errors(self, run: str | None = None) -> int:
        """Sandbox errors of ``run`` (None: of every run)."""
        return sum(r.sandbox_errors for name, r in self.runs().items() if run in (None, name))

    def to_json(self) -> dict[str, Any]:
        """The record on disk: runs not made left out, a NaN pass@k kept NaN (not null), as
        ``json.dumps`` wrote it before this model."""
        return self.model_dump(mode="json", exclude={n for n in RUNS if n not in self.runs()})

    @classmethod
    def read(cls, path: Path) -> EvaluationResults:
        return cls.model_validate(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> Path:
        return write_text(path, json.dumps(self.to_json(), indent=2) + "\n")


def problem_counts(
    rows: list[dict[str, Any]], *, exclude_sandbox_errors: bool = False
) -> dict[str, tuple[int, int]]:
    """(samples, passed) per problem of scored rows: what pass@k and its intervals are made of."""
    counts: dict[str, tuple[int, int]] = {}
    for row in rows:
        if exclude_sandbox_errors and row["status"] == "sandbox_error":
            continue
        n, c = counts.get(row["prompt_id"], (0, 0))
        counts[row["prompt_id"]] = (n + 1, c + bool(row["passed"]))
    return counts


def pass_at_k_of_rows(
    rows: list[dict[str, Any]], ks: list[int], *, exclude_sandbox_errors: bool = False
) -> dict[str, Any]:
    """Per-problem unbiased pass@k averaged over problems, from scored rows, each with its 95%
    interval (``pass@k_ci95``): Wilson for one greedy sample per problem, a bootstrap over
    problems otherwise."""
    counts = problem_counts(rows, exclude_sandbox_errors=exclude_sandbox_errors)
    scores: dict[str, Any] = {}
    for k in ks:
        if not counts or any(n < k for n, _ in counts.values()):
            scores[f"pass@{k}"], scores[f"pass@{k}_ci95"] = math.nan, None
            continue
        per_problem = pass_at_k_per_problem(counts, k)
        scores[f"pass@{k}"] = sum(per_problem.values()) / len(per_problem)
        if all(n == 1 for n, _ in counts.values()):
            scores[f"pass@{k}_ci95"] = wilson_interval(
                sum(c for _, c in counts.values()), len(counts)
            )
        else:
            scores[f"pass@{k}_ci95"] = bootstrap_interval(per_problem)
    return scores


def run_evaluate(config: EvalConfig, checkpoint: str, out_dir: Path) -> EvaluationResults:
    """Evaluate ``checkpoint`` (a model folder, hub id or ``embedded:...``); returns and writes
    the results. Results already in ``out_dir`` for the same checkpoint and settings are
    returned as they are (the stage is resumable)."""
    out_dir = Path(out_dir)
    done = out_dir / RESULTS_FILE
    settings = json.loads(config.model_dump_json())
    if done.is_file():
        previous = EvaluationResults.read(done)
        if previous.checkpoint == checkpoint and previous.config == settings:
            return previous
    model = ModelConfig(name_or_path=checkpoint)
    problems = load_problem_set(config.problems)
    tokenizer = load_tokenizer(model)
    prompts = [build_prompt(p, tokenizer, config.prompt_style) for p in problems.values()]
    sampler = get_sampler(model, config.engine)

    runs: dict[str, SamplingConfig] = {}
    if config.greedy:
        runs["greedy"] = SamplingConfig(
            num_generations=1, temperature=0.0, max_tokens=config.max_tokens, seed=config.seed
        )
    if config.num_samples:
        runs["sampled"] = SamplingConfig(
            num_generations=config.num_samples,
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
            seed=config.seed,
        )
    scores: dict[str, RunResult] = {}
    all_rows = []
    for name, sampling in runs.items():
        rows = sampler.sample(prompts, sampling)
        scored = score_rollouts(rows, problems, config.scoring, description=f"scoring {name}")
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
        **scores,
    )
    with staged(out_dir / SAMPLES_FILE) as staging, staging.open("w") as stream:
        for row in all_rows:
            stream.write(json.dumps(row) + "\n")
    results.write(done)  # last: marks the stage finished
    log.info("evaluation of %s: %s", checkpoint, _headline(results))
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
        from .difficulty_filter import filtered_problem_set  # it imports this module

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
