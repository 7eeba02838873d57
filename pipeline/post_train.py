"""The whole post-training run: one config (the base model, a run seed, an ordered list of
registered stages, the benchmarks) and :func:`run_post_train`, the loop that chains the stages
with an evaluation after every stage that trains. It runs without Prefect; the ``post-train``
flow hands it an executor that runs each stage as a task.

Stages chain through their artifacts (:class:`Artifacts`): each stage gets the newest of every
kind it needs or uses (the checkpoint, a filter's problems, scored rollouts, pairs), so
``[sft, rl, pairs, dpo]`` mines DPO's pairs from RL's rollouts and ``[sft, rl, rollouts,
pairs, dpo]`` from fresh ones. A stage's own ``model`` settings (LoRA, dtype, ...) are kept;
the weights come from the previous stage. Every stage gets a seed derived from the run seed.
The layout of a run folder (``<key>``: see :mod:`.stages.registry`)::

    run.json  report.md  pass_at_1.png  base/eval/<benchmark>/<key>/
    sft/<key>/  sft/<key>.json  sft/eval/<benchmark>/<key>/  rl/<key>/checkpoints/...
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from ..verifiers.problems import MBPP
from . import atomic
from .data.problem_sets import ProblemSet
from .inference.sampling import SamplingConfig
from .launch import LaunchConfig, LaunchingExecutor, execute_launched
from .model_config import ModelConfig
from .reporting.report import stage_rows, write_report
from .rl.policy_update import UpdateConfig
from .run_lock import run_folder_lock
from .stages import STAGES, Artifacts, Stage, get_stage, run_stage
from .stages.dpo import DPOStageConfig
from .stages.evaluation import EvalConfig
from .stages.pairs import PairMiningConfig
from .stages.rl import RLConfig
from .stages.rollouts import RolloutsConfig
from .stages.sft import SFTStageConfig
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
        config=(stage.config, Field(default_factory=stage.config)),
    )


if TYPE_CHECKING:  # a union built from the registry at import time: opaque to type checkers
    StageEntry = Any
else:
    StageEntry = Annotated[
        Union[tuple(_entry_model(stage) for stage in STAGES.values())],  # noqa: UP007
        Field(discriminator="stage"),
    ]


class PostTrainConfig(BaseModel):
    """One post-training run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str = Field("runs/post-train", description="where every artifact of the run goes")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the base model")
    seed: int = Field(0, description="the run seed: every stage's seed is derived from it")
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
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig,
        description="the processes each rank-aware stage runs on (no stage's key depends on it)",
    )

    @field_validator("stages", mode="before")
    @classmethod
    def _names_are_entries(cls, stages: Any) -> Any:
        if not isinstance(stages, list):
            return stages
        return [{"stage": entry} if isinstance(entry, str) else entry for entry in stages]

    @model_validator(mode="after")
    def _a_chain(self) -> PostTrainConfig:
        """Unique folder names, and every input a stage needs made by a stage before it."""
        makers = {"checkpoint": "model"}  # kind -> the stage that makes it
        names: set[str] = set()
        for index, entry in enumerate(self.stages):
            if entry.name in names or (entry.name is None and entry.stage in names):
                raise ValueError(
                    f"stages[{index}]: a second {entry.stage!r} stage needs a `name` of its own "
                    "(its folder in the run)"
                )
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
            makers.update(dict.fromkeys(stage.makes, stage.name))
        return self

    def entry(self, name: str) -> Any:
        """The stage entry whose folder is ``name``."""
        for entry in self.stages:
            if (entry.name or entry.stage) == name:
                return entry
        raise KeyError(f"no stage named {name!r} in this run")


class RunResult(BaseModel):
    checkpoint: str
    report: str
    rows: list[dict[str, Any]]
    stages: list[dict[str, Any]]


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
    config: PostTrainConfig, execute: LaunchingExecutor = execute_launched
) -> RunResult:
    """Every stage of ``config`` in order, each reused when its output is already there
    (:func:`run_stage`), with the evaluations after the base model and every stage that
    trains; then the report. ``execute`` runs each stage, a rank-aware one on
    ``config.launch``'s processes. The run folder is locked while it runs."""
    run_dir = Path(config.run_dir)
    executor = functools.partial(execute, launch=config.launch)
    with run_folder_lock(run_dir):
        artifacts = Artifacts(checkpoint=config.model.name_or_path)
        evaluations: dict[str, dict[str, Path]] = {name: {} for name in config.evaluations}
        done: list[dict[str, Any]] = []

        def evaluate(label: str, checkpoint: str) -> None:
            for benchmark, evaluation in config.evaluations.items():
                outputs = run_stage(
                    get_stage("evaluate"),
                    seeded(evaluation, derive_seed(config.seed, f"eval/{benchmark}")),
                    Artifacts(checkpoint=checkpoint),
                    run_dir / label / "eval" / benchmark,
                    executor,
                    label=f"{label}/{benchmark}",
                )
                evaluations[benchmark][label] = Path(str(outputs.evaluation))

        evaluate("base", str(artifacts.checkpoint))
        for entry in config.stages:
            stage, name = get_stage(entry.stage), entry.name or entry.stage
            stage_seed = derive_seed(config.seed, name)
            stage_config = seeded(with_run_model(entry.config, config.model), stage_seed)
            wanted = set(stage.needs) | set(stage.uses)
            inputs = Artifacts(**{k: v for k, v in artifacts.present().items() if k in wanted})
            log.info("stage %s (%s) from %s", name, stage.name, artifacts.checkpoint)
            outputs = run_stage(stage, stage_config, inputs, run_dir / name, executor, label=name)
            # A kind the stage makes but did not make this time (no pairs mined) is gone; the
            # checkpoint stays the last one trained.
            made: dict[str, Any] = {
                kind: getattr(outputs, kind)
                for kind in stage.makes
                if kind != "checkpoint" or outputs.checkpoint is not None
            }
            artifacts = artifacts.model_copy(update=made)
            done.append(
                {"name": name, "stage": stage.name, "seed": stage_seed, **outputs.present()}
            )
            if "checkpoint" in stage.makes and outputs.checkpoint is None:
                log.warning("%s made no checkpoint: the next stage starts from the last one", name)
            elif outputs.checkpoint is not None:
                evaluate(name, outputs.checkpoint)
            _write_run_record(run_dir, config, done)
        report = write_report(run_dir, evaluations)
    return RunResult(
        checkpoint=str(artifacts.checkpoint),
        report=str(report),
        rows=stage_rows(evaluations),
        stages=done,
    )


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
    """The README's main job: SmolLM2-135M on the CPU, small settings (about 15 minutes on 2
    cores): SFT on 32 MBPP training references, 3 GRPO iterations with dynamic sampling on
    MBPP training problems, DPO on pairs mined from fresh rollouts, greedy pass@1 on all 164
    HumanEval problems (with intervals and paired tests) before and after each stage."""
    mbpp_train = ProblemSet(source=MBPP, split="train", shuffle_seed=0)
    rl = RLConfig(
        problems=mbpp_train,
        iterations=3,
        prompts_per_iteration=4,
        max_sampling_rounds=2,
        sampling=SamplingConfig(num_generations=4, max_tokens=256),
        update=UpdateConfig(
            learning_rate=2e-6, micro_batch_size=4, sampler_is_cap=2.0, mask_truncated=True
        ),
    )
    stages = [
        SFTStageConfig(
            problems=mbpp_train.model_copy(update={"limit": 32}),
            training=TrainingSettings(per_device_train_batch_size=4, max_length=384),
        ),
        rl,
        RolloutsConfig(
            problems=mbpp_train.model_copy(update={"limit": 12}),
            sampling=SamplingConfig(num_generations=4, max_tokens=192),
            scoring=rl.scoring,
        ),
        # A 135M model rarely passes: prefer by reward (format, syntax) as well as pass/fail,
        # or there is nothing to prefer and DPO is skipped.
        PairMiningConfig(reward_margin=0.1),
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
            for name, stage in zip(["sft", "rl", "rollouts", "pairs", "dpo"], stages, strict=True)
        ],
        evaluations={
            "humaneval": EvalConfig(sampling=SamplingConfig(temperature=0.8, max_tokens=256))
        },
    )
