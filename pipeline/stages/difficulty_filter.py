"""The difficulty-filter stage: sample k completions per problem from a checkpoint, score them,
and keep the problems the model sometimes solves (DeepCoder's and AceCoder's offline filter).

A problem the model always fails, or always passes, gives every group the same reward, so it
teaches nothing under a group baseline; keeping those with a pass rate strictly inside
``(min_pass_rate, max_pass_rate)`` spends RL's samples where there is signal. The kept problems
are published as a problem file (each record with its pass rate) plus a manifest, so the RL
stage and the DPO rollouts can take them as their problems.

A weak model passes most of the problems it can solve rarely: k samples miss a problem of pass
rate p with probability (1 - p)^k. With ``max_samples`` the filter samples adaptively: k for
every problem, then k more, round after round, for the problems with no pass yet, until one
passes or the problem has ``max_samples`` (the rounds' counts are in the manifest: how many
problems each round added). ``held_out_fraction`` sets a seeded share of the kept problems
aside (``held_out.jsonl``), stratified by pass rate: the stages after it train on the rest,
and an evaluation can measure both. Layout of ``out_dir``::

    rollouts/rollouts.parquet  rollouts/scored.parquet   (round 1, resumable)
    rollouts/round-02/{problems.jsonl,rollouts.parquet,scored.parquet}  ...   (later rounds)
    problems/problems.jsonl  problems/held_out.jsonl  problems/pass_rates.json
    problems/manifest.json   (published)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from ...settings.config import Seed, Settings
from ...verifiers.problems import MBPP
from .. import atomic
from ..checkpoints.manifest import CheckpointManifest, publish, sha256_file
from ..data.problem_sets import ProblemSet, fingerprint, load_problem_set
from ..data.prompts import PromptStyle
from ..data.rows import TO_COUNT, read_rows
from ..inference.sampling import EngineConfig, SamplingConfig, check_room
from ..model_config import ModelConfig
from ..reporting.evaluations import problem_counts
from ..training import already_published, stage_version
from .registry import HELD_OUT_FILE, PROBLEMS_FILE, Artifacts, Stage, register, with_weights
from .rollouts import SampleStageConfig, run_sample
from .scoring import ScoreConfig, run_score

log = logging.getLogger(__name__)

STAGE = "difficulty-filter"
PASS_RATES_FILE = "pass_rates.json"


class DifficultyFilterConfig(Settings):
    """Which problems to rate, how many samples each, and the pass-rate range kept."""

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
    max_samples: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="adaptive sampling: problems with no pass yet get sampling.num_generations "
        "more samples per round until one passes or they have this many; null: one round",
    )
    held_out_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the kept problems set aside (seeded, stratified by pass rate) in "
        "held_out.jsonl; the stages after the filter train on the rest",
    )
    seed: Seed = Field(0, description="of the held-out split")

    @model_validator(mode="after")
    def _a_range(self) -> DifficultyFilterConfig:
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError(
                f"min_pass_rate={self.min_pass_rate} must be below max_pass_rate="
                f"{self.max_pass_rate}: no pass rate lies strictly between them"
            )
        if self.max_samples is not None and self.max_samples < self.sampling.num_generations:
            raise ValueError(
                f"max_samples={self.max_samples} is below the first round's "
                f"sampling.num_generations={self.sampling.num_generations}"
            )
        check_room(self.sampling.max_tokens, self.engine, "sampling.max_tokens")
        return self

    @property
    def rounds(self) -> int:
        """Sampling rounds at most: the first for every problem, then the adaptive ones."""
        k = self.sampling.num_generations
        return (self.max_samples or k) // k


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


def held_out_split(rates: dict[str, float], fraction: float, seed: int) -> set[str]:
    """The task ids of ``rates`` (task -> pass rate) to hold out: ``fraction`` of them, spread
    evenly over the pass rates (every 1/fraction-th in pass-rate order, ties in a seeded order),
    so the held-out problems are as hard as those trained on. At least one stays to train."""
    order = sorted(rates)
    random.Random(seed).shuffle(order)
    order.sort(key=rates.__getitem__)  # stable: the seeded order breaks ties
    count = min(round(fraction * len(order)), len(order) - 1)
    return {order[math.floor((i + 0.5) * len(order) / count)] for i in range(count)}


def run_difficulty_filter(config: DifficultyFilterConfig, out_dir: Path) -> Path:
    """Rate ``config.problems`` with the model and publish the ones in range; returns the
    problem file (of the problems to train on). Reused when already published for this config;
    every round's sampling and scoring resume from their files."""
    out_dir = Path(out_dir)
    published = out_dir / "problems"
    if already_published(published, STAGE, config):
        return published / PROBLEMS_FILE
    problems = load_problem_set(config.problems)
    rows, rounds = _sample_rounds(config, problems, out_dir / "rollouts")
    # A sample the sandbox failed on says nothing of the problem's difficulty (scoring stops
    # the stage past its bound on them): a problem with no other sample is not rated.
    rates = select_problems(problem_counts(rows, exclude_sandbox_errors=True), config)
    kept = [task for task in problems if task in rates and rates[task]["kept"]]
    if not kept:
        raise ValueError(
            f"{STAGE}: no problem of {len(problems)} has a pass rate in "
            f"({config.min_pass_rate}, {config.max_pass_rate}) with "
            f"{config.max_samples or config.sampling.num_generations} samples at most; widen "
            "the range or sample more"
        )
    held_out = held_out_split(
        {task: rates[task]["pass_rate"] for task in kept}, config.held_out_fraction, config.seed
    )
    for task in kept:
        rates[task]["held_out"] = task in held_out
    histogram = _histogram([r["pass_rate"] for r in rates.values()])
    metrics = _filter_metrics(rates, kept, held_out, len(rows), rounds)
    data = {"problems": fingerprint(problems), "scored": _digest_of(out_dir / "rollouts")}

    def write(folder: Path) -> None:
        for name, part in ((PROBLEMS_FILE, False), (HELD_OUT_FILE, True)):
            with (folder / name).open("w") as stream:
                for task in kept:
                    if (task in held_out) == part:
                        record = problems[task].model_dump(mode="json", exclude_none=True)
                        record["pass_rate"] = rates[task]["pass_rate"]
                        stream.write(json.dumps(record) + "\n")
        report = {"histogram": histogram, "rounds": rounds, "problems": rates}
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
        "%s: kept %d of %d problems (%d to train on, %d held out; never passed %d, always "
        "passed %d; %d samples in %d rounds)",
        STAGE,
        len(kept),
        len(problems),
        metrics["train"],
        metrics["held_out"],
        metrics["never_passed"],
        metrics["always_passed"],
        len(rows),
        len(rounds),
    )
    return published / PROBLEMS_FILE


def _filter_metrics(
    rates: dict[str, dict[str, float]],
    kept: list[str],
    held_out: set[str],
    samples: int,
    rounds: list[dict[str, int]],
) -> dict[str, Any]:
    """How many problems were rated, kept and held out, their pass rates, and the rounds."""
    return {
        "problems": len(rates),
        "kept": len(kept),
        "train": len(kept) - len(held_out),
        "held_out": len(held_out),
        "samples": samples,
        "rounds": rounds,
        "never_passed": sum(r["passed"] == 0 for r in rates.values()),
        "always_passed": sum(r["passed"] == r["samples"] for r in rates.values()),
        "mean_pass_rate": sum(r["pass_rate"] for r in rates.values()) / len(rates),
        "kept_mean_pass_rate": sum(rates[t]["pass_rate"] for t in kept) / len(kept),
    }


def _sample_rounds(
    config: DifficultyFilterConfig, problems: dict[str, Any], work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """Every round's scored rows (``TO_COUNT`` columns) and what each round did: round 1
    samples every problem, each later one the problems with no pass yet and room left under
    ``max_samples``. A round's files are reused when they are there (the stage resumes)."""
    rows: list[dict[str, Any]] = []
    rounds: list[dict[str, int]] = []
    for number in range(1, config.rounds + 1):
        passed = {row["prompt_id"] for row in rows if row["passed"]}
        todo = [task for task in problems if task not in passed]
        if not todo:
            break
        folder = work if number == 1 else work / f"round-{number:02d}"
        problem_set = config.problems
        if number > 1:  # the problems still without a pass, as a problem file of the round
            problem_set = ProblemSet(source=str(folder / PROBLEMS_FILE), split="all")
            if not (folder / PROBLEMS_FILE).is_file():
                folder.mkdir(parents=True, exist_ok=True)
                atomic.write_text(
                    folder / PROBLEMS_FILE,
                    "".join(
                        json.dumps(problems[t].model_dump(mode="json", exclude_none=True)) + "\n"
                        for t in todo
                    ),
                )
        sample = SampleStageConfig(
            model=config.model,
            problems=problem_set,
            prompt_style=config.prompt_style,
            sampling=config.sampling.model_copy(update={"seed": config.sampling.seed + number - 1}),
            engine=config.engine,
        )
        rollouts = run_sample(sample, folder)
        scored = read_rows(run_score(config.scoring, rollouts, problem_set, folder), TO_COUNT)
        rows += scored
        first_passes = {row["prompt_id"] for row in scored if row["passed"]}
        rounds.append(
            {
                "round": number,
                "problems_sampled": len(todo),
                "samples": len(scored),
                "problems_added": len(first_passes),  # their first pass came in this round
            }
        )
        log.info(
            "%s: round %d sampled %d problems x %d: %d of them passed for the first time",
            STAGE,
            number,
            len(todo),
            config.sampling.num_generations,
            len(first_passes),
        )
    return rows, rounds


def _digest_of(work: Path) -> str:
    """One digest of every round's scored rollouts (the filter's lineage)."""
    files = sorted(work.rglob("scored.parquet"))
    return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()


def _histogram(rates: list[float], bins: int = 10) -> dict[str, int]:
    """Problems per pass-rate bin: how the model's difficulty spreads over the set."""
    counts = [0] * bins
    for rate in rates:
        counts[min(int(rate * bins), bins - 1)] += 1
    return {f"{i / bins:.1f}-{(i + 1) / bins:.1f}": n for i, n in enumerate(counts)}


def _stage(config: DifficultyFilterConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    run_difficulty_filter(with_weights(config, inputs.checkpoint), out_dir)
    return Artifacts(problems=str(Path(out_dir) / "problems"))


def _holds_out(config: DifficultyFilterConfig) -> bool:
    return config.held_out_fraction > 0


register(
    Stage(
        name="filter",
        config=DifficultyFilterConfig,
        run=_stage,
        needs=(),
        uses=("checkpoint",),
        makes=("problems",),
        description="rate problems by pass rate and keep those the model sometimes solves",
        holds_out=_holds_out,
    )
)
