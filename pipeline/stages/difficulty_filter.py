"""The difficulty-filter stage: sample k completions per problem from a checkpoint, score them,
and keep the problems the model sometimes solves (DeepCoder's and AceCoder's offline filter).

A problem the model always fails, or always passes, gives every group the same reward, so it
teaches nothing under a group baseline; keeping those with a pass rate strictly inside
``(min_pass_rate, max_pass_rate)`` spends RL's samples where there is signal. The kept problems
are published as a problem file (each record with its pass rate) plus a manifest, so the RL
stage and the DPO rollouts can take them as their problems. Layout of ``out_dir``::

    rollouts/rollouts.parquet  rollouts/scored.parquet   (the work, resumable)
    problems/problems.jsonl  problems/pass_rates.json  problems/manifest.json   (published)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...verifiers.problems import MBPP
from ..checkpoints.manifest import CheckpointManifest, publish, sha256_file
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import PromptStyle
from ..data.rows import TO_COUNT, read_rows
from ..inference.sampling import EngineConfig, SamplingConfig, check_room
from ..model_config import ModelConfig
from ..reporting.evaluations import problem_counts
from ..training import already_published, stage_version
from .registry import PROBLEMS_FILE, Artifacts, Stage, register, with_weights
from .rollouts import SampleStageConfig, run_sample
from .scoring import ScoreConfig, run_score

log = logging.getLogger(__name__)

STAGE = "difficulty-filter"
PASS_RATES_FILE = "pass_rates.json"


class DifficultyFilterConfig(BaseModel):
    """Which problems to rate, how many samples each, and the pass-rate range kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = Field(default_factory=ModelConfig, description="the model that rates")
    problems: ProblemSet = Field(default_factory=lambda: ProblemSet(source=MBPP, split="train"))
    prompt_style: PromptStyle = "chat"
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(num_generations=8, temperature=1.0),
        description="k completions per problem (num_generations), as RL will sample them",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scoring: ScoreConfig = Field(default_factory=ScoreConfig)
    min_pass_rate: float = Field(0.0, ge=0, le=1, description="keep pass rates above this")
    max_pass_rate: float = Field(1.0, ge=0, le=1, description="keep pass rates below this")

    @model_validator(mode="after")
    def _a_range(self) -> DifficultyFilterConfig:
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError(
                f"min_pass_rate={self.min_pass_rate} must be below max_pass_rate="
                f"{self.max_pass_rate}: no pass rate lies strictly between them"
            )
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        return self


def select_problems(
    counts: dict[str, tuple[int, int]], config: DifficultyFilterConfig
) -> dict[str, dict[str, float]]:
    """Each rated problem's samples, passes, pass rate and whether it is kept (strictly inside
    the range)."""
    return {
        task: {
            "samples": n,
            "passed": c,
            "pass_rate": c / n,
            "kept": config.min_pass_rate < c / n < config.max_pass_rate,
        }
        for task, (n, c) in counts.items()
    }


def run_difficulty_filter(config: DifficultyFilterConfig, out_dir: Path) -> Path:
    """Rate ``config.problems`` with the model and publish the ones in range; returns the
    problem file. Reused when already published for this config; sampling and scoring resume
    from their files."""
    out_dir = Path(out_dir)
    published = out_dir / "problems"
    if already_published(published, STAGE, config):
        return published / PROBLEMS_FILE
    problems = load_problem_set(config.problems)
    work = out_dir / "rollouts"
    sample = SampleStageConfig(
        model=config.model,
        problems=config.problems,
        prompt_style=config.prompt_style,
        sampling=config.sampling,
        engine=config.engine,
    )
    rollouts = run_sample(sample, work)
    scored = run_score(config.scoring, rollouts, config.problems, work)
    rates = select_problems(problem_counts(read_rows(scored, TO_COUNT)), config)
    kept = [task for task in problems if rates[task]["kept"]]
    if not kept:
        raise ValueError(
            f"{STAGE}: no problem of {len(problems)} has a pass rate in "
            f"({config.min_pass_rate}, {config.max_pass_rate}) with "
            f"{config.sampling.num_generations} samples each; widen the range or sample more"
        )
    histogram = _histogram([r["pass_rate"] for r in rates.values()])
    metrics = _filter_metrics(rates, kept)
    data = {"problems": fingerprint(problems), "scored": sha256_file(scored)}

    def write(folder: Path) -> None:
        with (folder / PROBLEMS_FILE).open("w") as stream:
            for task in kept:
                record = problems[task].model_dump(mode="json", exclude_none=True)
                stream.write(json.dumps({**record, "pass_rate": rates[task]["pass_rate"]}) + "\n")
        report = {"histogram": histogram, "problems": rates}
        (folder / PASS_RATES_FILE).write_text(json.dumps(report, indent=2) + "\n")

    manifest = CheckpointManifest(
        stage=STAGE,
        version=stage_version(STAGE, config, data),
        parent=config.model.name_or_path,
        config=config.model_dump(mode="json"),
        data=data,
        metrics=metrics,
    )
    publish(published, write, manifest)
    log.info(
        "%s: kept %d of %d problems (never passed %d, always passed %d)",
        STAGE,
        len(kept),
        len(problems),
        metrics["never_passed"],
        metrics["always_passed"],
    )
    return published / PROBLEMS_FILE


def _filter_metrics(rates: dict[str, dict[str, float]], kept: list[str]) -> dict[str, float]:
    """How many problems were rated and kept, and their pass rates."""
    return {
        "problems": len(rates),
        "kept": len(kept),
        "never_passed": sum(r["passed"] == 0 for r in rates.values()),
        "always_passed": sum(r["passed"] == r["samples"] for r in rates.values()),
        "mean_pass_rate": sum(r["pass_rate"] for r in rates.values()) / len(rates),
        "kept_mean_pass_rate": sum(rates[t]["pass_rate"] for t in kept) / len(kept),
    }


def _histogram(rates: list[float], bins: int = 10) -> dict[str, int]:
    """Problems per pass-rate bin: how the model's difficulty spreads over the set."""
    counts = [0] * bins
    for rate in rates:
        counts[min(int(rate * bins), bins - 1)] += 1
    return {f"{i / bins:.1f}-{(i + 1) / bins:.1f}": n for i, n in enumerate(counts)}


def _stage(config: DifficultyFilterConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    run_difficulty_filter(with_weights(config, inputs.checkpoint), out_dir)
    return Artifacts(problems=str(Path(out_dir) / "problems"))


register(
    Stage(
        name="filter",
        config=DifficultyFilterConfig,
        run=_stage,
        needs=(),
        uses=("checkpoint",),
        makes=("problems",),
        description="rate problems by pass rate and keep those the model sometimes solves",
    )
)
