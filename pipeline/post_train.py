"""The whole post-training run: one config (the base model, a run seed, an ordered list of
registered stages, the benchmarks) and :func:`run_post_train`, the loop that chains the stages
with an evaluation after every stage that trains. It runs without Prefect; the ``post-train``
flow hands it an executor that runs each stage as a task.

Stages chain through their artifacts (:class:`Artifacts`): each stage gets the newest of every
kind it needs or uses (the checkpoint, a filter's problems, scored rollouts, pairs), so
``[sft, rl, pairs, dpo]`` mines DPO's pairs from RL's rollouts and ``[sft, rl, rollouts,
pairs, dpo]`` from fresh ones. A stage entry with ``after: <name>`` takes the artifacts as they
were after that earlier stage instead: ``[sft, filter, rl, {stage: rft, after: filter}]`` trains
two arms from the same checkpoint and problems. A stage's own ``model`` settings (LoRA, dtype,
...) are kept; the weights come from the previous stage. Every stage gets a seed derived from
the run seed. An evaluation with ``problems_from`` measures the problems a filter of the run
kept: every checkpoint, those made before the filter as soon as it has run.
The layout of a run folder (``<key>``: see :mod:`.stages.registry`)::

    run.json  report.md  pass_at_1.png  base/eval/<benchmark>/<key>/
    sft/<key>/  sft/<key>.json  sft/eval/<benchmark>/<key>/  rl/<key>/checkpoints/...
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from ..settings.config import Seed, Settings
from ..settings.walk import settings_of
from ..verifiers.problems import MBPP
from . import atomic
from .data.problem_sets import ProblemSet
from .inference.sampling import SamplingConfig
from .launch import LaunchConfig, LaunchingExecutor, execute_launched
from .model_config import ModelConfig
from .progress import RunSteps
from .reporting.report import stage_rows, write_report
from .rl.update_config import UpdateConfig
from .run_lock import run_folder_lock
from .stages import STAGES, Artifacts, Stage, get_stage, run_stage
from .stages.difficulty_filter import DifficultyFilterConfig
from .stages.dpo import DPOStageConfig
from .stages.evaluation import EvalConfig
from .stages.pairs import PairMiningConfig
from .stages.rl import RLConfig
from .stages.rollouts import RolloutsConfig
from .stages.sft import SFTStageConfig
from .tracking import RunTracking, TrackerName
from .training import TrainingSettings

log = logging.getLogger("codepost.run")
RUN_RECORD = "run.json"


def _entry_model(stage: Stage) -> type[BaseModel]:
    """``{stage: <name>, name: <folder>, config: <the stage's config>}`` for one stage."""
    return create_model(
        "".join(part.title() for part in stage.name.split("-")) + "Entry",
        __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__=stage.description,
        stage=(Literal[stage.name], ...),  # type: ignore[arg-type]
        name=(
            str | None,
            Field(None, pattern=r"^[a-z0-9][a-z0-9_-]*$", description="folder; default: stage"),
        ),
        after=(
            str | None,
            Field(
                None,
                description="start from the artifacts as they were after the earlier stage of "
                "this name (an arm branching from it); default: after the stage before",
            ),
        ),
        config=(stage.config, Field(default_factory=stage.config)),
    )


if TYPE_CHECKING:  # a union built from the registry at import time: opaque to type checkers
    StageEntry = Any
else:
    StageEntry = Annotated[
        Union[tuple(_entry_model(stage) for stage in STAGES.values())],  # noqa: UP007
        Field(discriminator="stage"),
    ]


class PostTrainConfig(Settings):
    """One post-training run."""

    run_dir: str = Field("runs/post-train", description="where every artifact of the run goes")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the base model")
    seed: Seed = Field(0, description="the run seed: every stage's seed is derived from it")
    stages: list[StageEntry] = Field(
        default_factory=lambda: ["sft", "rl", "rollouts", "pairs", "dpo"],
        validate_default=True,
        description="the stages in order, each `{stage, name, config}` (or just the stage's "
        f"name); registered: {', '.join(sorted(STAGES))}",
    )
    evaluations: dict[str, EvalConfig] = Field(
        default_factory=lambda: {"humaneval": EvalConfig()},
        min_length=1,
        description="benchmark name -> evaluation, run on the base model and after every "
        "stage that trains",
    )
    evaluate_base: bool = Field(
        True,
        description="evaluate the base model too; off: the first stage that trains is the one "
        "the others are compared with (its numbers known, the samples spent elsewhere)",
    )
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig,
        description="the processes each rank-aware stage runs on (no stage's key depends on it)",
    )
    report_to: list[TrackerName] = Field(
        default_factory=list,
        description="experiment trackers that get the run's config, metrics and report "
        "(docs/observability.md); none by default",
    )

    @field_validator("stages", mode="before")
    @classmethod
    def _names_are_entries(cls, stages: Any) -> Any:
        if not isinstance(stages, list):
            return stages
        return [{"stage": entry} if isinstance(entry, str) else entry for entry in stages]

    @model_validator(mode="after")
    def _a_chain(self) -> PostTrainConfig:
        """Unique folder names, every input a stage needs made by a stage before it, and no
        stage training on problems a filter before it holds out."""
        makers = {"checkpoint": "model"}  # kind -> the stage that makes it
        makers_after: dict[str, dict[str, str]] = {}  # stage name -> makers after it
        data = _TrainingData()
        data_after: dict[str, _TrainingData] = {}
        names: set[str] = set()
        for index, entry in enumerate(self.stages):
            if entry.name in names or (entry.name is None and entry.stage in names):
                raise ValueError(
                    f"stages[{index}]: a second {entry.stage!r} stage needs a `name` of its own "
                    "(its folder in the run)"
                )
            if entry.after is not None:
                if entry.after not in makers_after:
                    raise ValueError(
                        f"stages[{index}] ({entry.stage}): after={entry.after!r} names no stage "
                        f"before it ({', '.join(makers_after) or 'none'})"
                    )
                makers, data = dict(makers_after[entry.after]), data_after[entry.after]
            names.add(entry.name or entry.stage)
            stage = get_stage(entry.stage)
            missing = [kind for kind in stage.needs if kind not in makers]
            if missing:
                able = sorted(s.name for s in STAGES.values() if set(missing) & set(s.makes))
                raise ValueError(
                    f"stages[{index}] ({entry.stage}) needs {', '.join(missing)}: put a stage "
                    f"that makes them ({', '.join(able)}) before it"
                )
            if stage.check_inputs is not None:
                try:
                    stage.check_inputs(entry.config, makers)
                except ValueError as exc:
                    raise ValueError(f"stages[{index}] ({entry.stage}): {exc}") from None
            taken = [kind for kind in (*stage.needs, *stage.uses) if kind in makers]
            data = data.after(f"stages[{index}] ({entry.stage})", stage, entry.config, taken)
            makers.update(dict.fromkeys(stage.makes, stage.name))
            makers_after[entry.name or entry.stage] = dict(makers)
            data_after[entry.name or entry.stage] = data
        filtered = [name for name, e in self.evaluations.items() if e.problems_from is not None]
        if filtered and not any("problems" in made for made in makers_after.values()):
            raise ValueError(
                f"evaluations {', '.join(filtered)} take problems_from a filter: put a stage "
                "that makes problems (filter) in `stages`"
            )
        return self

    def entry(self, name: str) -> Any:
        """The stage entry whose folder is ``name``."""
        for entry in self.stages:
            if (entry.name or entry.stage) == name:
                return entry
        raise KeyError(f"no stage named {name!r} in this run")


@dataclass(frozen=True)
class _Problems:
    """Problems that training data may come from: ``problem_sets``, named by the stage
    ``named_by``; with ``part_of``, only the part that filter stage hands on to train on."""

    named_by: str
    problem_sets: tuple[ProblemSet, ...]
    part_of: str | None = None

    def may_share(self, other: _Problems) -> bool:
        return any(a.may_share_problems(b) for a in self.problem_sets for b in other.problem_sets)


@dataclass(frozen=True)
class _TrainingData:
    """Where what the stages so far made comes from (kind -> the problems it may hold), and the
    last filter that holds problems out: no stage after it may train on those."""

    made_from: dict[str, tuple[_Problems, ...]] = field(default_factory=dict)
    held_out: _Problems | None = None

    def after(
        self, label: str, stage: Stage, config: BaseModel, taken: Sequence[str]
    ) -> _TrainingData:
        """The state once ``stage`` (``label``: ``stages[i] (name)``) has run on the kinds it
        takes; ValueError naming both stages when it trains on problems held out."""
        own = () if "problems" in taken else tuple(settings_of(config, ProblemSet))
        reads = [("its own problems", _Problems(label, own))] if own else []
        reads += [(kind, source) for kind in taken for source in self.made_from.get(kind, ())]
        held = self.held_out
        if held is not None and "checkpoint" in stage.makes:
            for what, source in reads:
                if source.part_of != held.named_by and source.may_share(held):
                    sets = ", ".join(f"{p.source} split {p.split}" for p in source.problem_sets)
                    if source.named_by != label:
                        what = f"{what} made from the problems {source.named_by} read"
                    raise ValueError(
                        f"{label} trains on {what} ({sets}), which may hold problems that "
                        f"{held.named_by} sets aside for evaluation (its held_out_fraction): a "
                        "held-out score would measure problems the model trained on. Give it "
                        "problems the filter does not rate, or hold none out"
                    )
        made_from = dict(self.made_from)
        for kind in stage.makes:
            if kind == "problems":  # the part it hands on: from its own problems
                made_from[kind] = (_Problems(label, own, part_of=label),)
            elif kind != "checkpoint":
                made_from[kind] = tuple(source for _, source in reads)
        if "problems" in stage.makes and stage.holds_out is not None and stage.holds_out(config):
            held = _Problems(label, own)
        return _TrainingData(made_from, held)


class RunResult(BaseModel):
    checkpoint: str
    report: str
    rows: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    evaluations: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="benchmark -> model (base, a stage) -> its folder"
    )


def derive_seed(run_seed: int, label: str) -> int:
    """A stage's seed: stable for a run seed and the stage's name, different between stages."""
    digest = hashlib.sha256(f"{run_seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 2**31


def seeded(config: BaseModel, seed: int) -> BaseModel:
    """``config`` with every ``seed`` field it does not set explicitly, at any depth, ``seed``."""
    updates: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        if name == "seed" and name not in config.model_fields_set:
            updates[name] = seed
        elif isinstance(value, BaseModel):
            updates[name] = seeded(value, seed)
    return config.model_copy(update=updates)


def with_run_model(config: BaseModel, run_model: ModelConfig) -> BaseModel:
    """The run's model under the stage's own ``model`` settings (those it sets explicitly)."""
    if "model" not in type(config).model_fields:
        return config
    own = config.model  # type: ignore[attr-defined]
    explicit = {name: getattr(own, name) for name in own.model_fields_set - {"name_or_path"}}
    return config.model_copy(update={"model": run_model.model_copy(update=explicit)})


def run_post_train(
    config: PostTrainConfig,
    execute: LaunchingExecutor = execute_launched,
    then: Callable[[RunResult, RunTracking], None] | None = None,
) -> RunResult:
    """Every stage of ``config`` in order, each reused when its output is already there
    (:func:`run_stage`), with the evaluations after the base model and every stage that
    trains; then the report. ``execute`` runs each stage, a rank-aware one on
    ``config.launch``'s processes. The run folder is locked while it runs; ``then`` (a
    nightly's promotion gate) runs last, still holding it, with the run's trackers."""
    run_dir = Path(config.run_dir)
    with (
        run_folder_lock(run_dir),
        RunTracking(config.report_to, run_dir, config.model_dump(mode="json")) as trackers,
    ):
        run = _Run(config, functools.partial(execute, launch=config.launch), trackers)
        if config.evaluate_base:
            run.evaluate("base", str(run.artifacts.checkpoint), None, False)
        for entry in config.stages:
            run.stage(entry)
        result = run.result()
        if then is not None:
            then(result, trackers)
    return result


@dataclass
class _Run:
    """A run in progress: the artifacts each stage hands on, the checkpoints evaluated so far
    and where each trained from, the evaluations' folders, and the stages done."""

    config: PostTrainConfig
    executor: Callable[..., Any]
    trackers: RunTracking
    artifacts: Artifacts = field(init=False)
    after: dict[str, Artifacts] = field(default_factory=dict)  # stage name -> artifacts after it
    evaluations: dict[str, dict[str, Path]] = field(init=False)  # benchmark -> label -> folder
    evaluated: dict[str, str] = field(default_factory=dict)  # label -> checkpoint, in order
    started_from: dict[str, str | None] = field(default_factory=dict)  # label -> trained from
    done: list[dict[str, Any]] = field(default_factory=list)
    steps: RunSteps = field(init=False)
    run_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.config.run_dir)
        self.artifacts = Artifacts(checkpoint=self.config.model.name_or_path)
        self.evaluations = {name: {} for name in self.config.evaluations}
        self.steps = RunSteps(_steps(self.config), is_evaluation=lambda label: "/" in label)

    def evaluate(self, label: str, checkpoint: str, problems: str | None, new: bool) -> None:
        """Every benchmark on ``checkpoint`` (with ``new`` problems: only those on the run's
        problems); one on the run's problems waits until a filter has made them."""
        self.evaluated[label] = checkpoint
        for benchmark, evaluation in self.config.evaluations.items():
            if not _applies(evaluation, problems, new):
                continue
            with self.steps.step(f"{label}/{benchmark}"):
                outputs = run_stage(
                    get_stage("evaluate"),
                    seeded(evaluation, derive_seed(self.config.seed, f"eval/{benchmark}")),
                    Artifacts(
                        checkpoint=checkpoint,
                        problems=problems if evaluation.problems_from else None,
                    ),
                    self.run_dir / label / "eval" / benchmark,
                    self.executor,
                    label=f"{label}/{benchmark}",
                )
            self.evaluations[benchmark][label] = Path(str(outputs.evaluation))
            self.trackers.log_evaluation(label, benchmark, self.evaluations[benchmark][label])

    def stage(self, entry: StageEntry) -> None:
        """One stage from the artifacts it takes, then the evaluations its outputs call for."""
        stage, name = get_stage(entry.stage), entry.name or entry.stage
        if entry.after is not None:
            self.artifacts = self.after[entry.after]
        trained_from = str(self.artifacts.checkpoint)
        stage_seed = derive_seed(self.config.seed, name)
        stage_config = seeded(with_run_model(entry.config, self.config.model), stage_seed)
        wanted = set(stage.needs) | set(stage.uses)
        inputs = Artifacts(**{k: v for k, v in self.artifacts.present().items() if k in wanted})
        log.info("stage %s (%s) from %s", name, stage.name, self.artifacts.checkpoint)
        with self.steps.step(name), self.trackers.stage(name):
            outputs = run_stage(
                stage, stage_config, inputs, self.run_dir / name, self.executor, label=name
            )
        # A kind the stage makes but did not make this time (no pairs mined) is gone; the
        # checkpoint stays the last one trained.
        made: dict[str, Any] = {
            kind: getattr(outputs, kind)
            for kind in stage.makes
            if kind != "checkpoint" or outputs.checkpoint is not None
        }
        self.artifacts = self.after[name] = self.artifacts.model_copy(update=made)
        self.trackers.made(made.get("checkpoint"))
        self.done.append(
            {"name": name, "stage": stage.name, "seed": stage_seed, **outputs.present()}
        )
        if outputs.problems is not None:  # the checkpoints so far, on the new problems
            for label, checkpoint in list(self.evaluated.items()):
                self.evaluate(label, checkpoint, outputs.problems, True)
        if "checkpoint" in stage.makes and outputs.checkpoint is None:
            log.warning("%s made no checkpoint: the next stage starts from the last one", name)
            for benchmark, evaluation in self.config.evaluations.items():
                if _applies(evaluation, self.artifacts.problems, False):
                    self.steps.skip(f"{name}/{benchmark}")
        elif outputs.checkpoint is not None:
            self.started_from[name] = next(
                (label for label, c in reversed(self.evaluated.items()) if c == trained_from),
                None,
            )
            self.evaluate(name, outputs.checkpoint, self.artifacts.problems, False)
        _write_run_record(self.run_dir, self.config, self.done)

    def result(self) -> RunResult:
        """The report written, logged to the trackers, and the run's result."""
        report = write_report(self.run_dir, self.evaluations, self.started_from)
        self.trackers.log_artifacts(
            [report, *self.run_dir.glob("*.png"), *self.run_dir.glob("*/*/*.png")]
        )
        return RunResult(
            checkpoint=str(self.artifacts.checkpoint),
            report=str(report),
            rows=stage_rows(self.evaluations, self.started_from),
            stages=self.done,
            evaluations={
                benchmark: {label: str(folder) for label, folder in folders.items()}
                for benchmark, folders in self.evaluations.items()
            },
        )


def _applies(evaluation: EvalConfig, problems: str | None, new_problems: bool) -> bool:
    """Whether ``evaluation`` runs now: one on a filter's problems once there are problems (and
    only those when the problems are new), any other when the problems are not new."""
    if evaluation.problems_from is None:
        return not new_problems
    return problems is not None


def _steps(config: PostTrainConfig) -> list[str]:
    """The run's steps in order: each stage, and each evaluation (``<model>/<benchmark>``) of
    the base model and of every stage that makes a checkpoint; those on a filter's problems of
    every model so far once the filter has run."""
    labels: list[str] = []
    evaluated: list[str] = []
    problems_after: dict[str, str | None] = {}
    problems: str | None = None

    def evaluations(label: str, new_problems: bool) -> list[str]:
        return [
            f"{label}/{benchmark}"
            for benchmark, evaluation in config.evaluations.items()
            if _applies(evaluation, problems, new_problems)
        ]

    if config.evaluate_base:
        labels += evaluations("base", False)
        evaluated.append("base")
    for entry in config.stages:
        name, stage = entry.name or entry.stage, get_stage(entry.stage)
        problems = problems_after[entry.after] if entry.after else problems
        labels.append(name)
        if "problems" in stage.makes:
            problems = name
            labels += [step for label in evaluated for step in evaluations(label, True)]
        if "checkpoint" in stage.makes:
            labels += evaluations(name, False)
            evaluated.append(name)
        problems_after[name] = problems
    return labels


def _write_run_record(run_dir: Path, config: PostTrainConfig, done: list[dict[str, Any]]) -> None:
    atomic.write_json(
        run_dir / RUN_RECORD,
        {
            "seed": config.seed,
            "config": config.model_dump(mode="json"),
            "stages": done,
            "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
    )


def embedded_default(run_dir: str = "runs/post-train") -> PostTrainConfig:
    """The README's main job: SmolLM2-135M on the CPU, small settings (under 20 minutes on 2
    quiet cores): SFT on 32 MBPP training references, a difficulty filter that rates 48 MBPP
    training problems with the run's own SFT checkpoint, 3 GRPO iterations with dynamic
    sampling on the problems it sometimes solved, DPO on pairs mined from fresh rollouts on
    them, greedy pass@1 on all 164 HumanEval problems (with intervals and paired tests) before
    and after each stage."""
    mbpp_train = ProblemSet(source=MBPP, split="train", shuffle_seed=0)
    # Passing MBPP answers are short (at most 36 tokens in the main job's RL): a longer
    # completion is a loop that would hold the batch to the end and is masked when cut. At
    # T = 1 this SFT checkpoint passed 1 of 48 problems in 4 samples each; T = 0.7 is round 2's.
    short = SamplingConfig(num_generations=4, max_tokens=128, temperature=0.7)
    # Most MBPP problems are out of a 135M model's reach: a group whose samples all fail
    # teaches nothing and is dropped. The filter rates the 32 problems SFT trained on and 16
    # more with this run's SFT checkpoint, sampled as RL samples (4 more samples where none
    # passed yet); RL and the rollouts DPO's pairs come from take the problems it passed some
    # but not all of the time.
    rate = DifficultyFilterConfig(
        problems=mbpp_train.model_copy(update={"limit": 48}), sampling=short, max_samples=8
    )
    rl = RLConfig(
        problems=mbpp_train,  # the filter's kept problems replace these
        iterations=3,
        prompts_per_iteration=4,
        max_sampling_rounds=2,
        sampling=short,
        update=UpdateConfig(
            learning_rate=2e-6, micro_batch_size=4, sampler_is_cap=2.0, mask_truncated=True
        ),
    )
    stages = [
        SFTStageConfig(
            problems=mbpp_train.model_copy(update={"limit": 32}),
            training=TrainingSettings(per_device_train_batch_size=4, max_length=384),
        ),
        rate,
        rl,
        RolloutsConfig(problems=mbpp_train, sampling=short, scoring=rl.scoring),
        # One pair per problem, preferring by pass/fail or else by reward (format, syntax): a
        # 135M model rarely passes, and DPO's steps are the main job's dearest per sample.
        PairMiningConfig(strategies=["best_vs_worst"], reward_margin=0.1),
        DPOStageConfig(
            training=TrainingSettings(
                learning_rate=5e-7, per_device_train_batch_size=2, max_length=384
            )
        ),
    ]
    return PostTrainConfig(
        run_dir=run_dir,
        stages=[
            {"stage": name, "config": stage}
            for name, stage in zip(
                ["sft", "filter", "rl", "rollouts", "pairs", "dpo"], stages, strict=True
            )
        ],
        evaluations={
            # No greedy completion that passed was longer than 160 tokens (base and SFT, 164
            # problems each); 32 of 164 ran to 256, past the fence-free code of a loop.
            "humaneval": EvalConfig(sampling=SamplingConfig(temperature=0.8, max_tokens=192))
        },
    )
