"""Prefect flows: ``post-train``, which runs the pipeline's run loop with every stage as a task,
a flow for every registered stage, and ``score``, which fans scoring out over a task runner.

Nothing here names a stage: each registered stage (``codepost.pipeline.stages``) becomes a task
with retries for transient failures (the sandbox or the engine), the ``accelerator`` tag (a
concurrency limit of one keeps accelerator-bound work one at a time), and artifacts (a markdown
summary with its plots, an evaluation's table); and a flow whose parameters are the inputs it
needs, its pydantic config and an output folder. The UI renders the configs as forms, and
Prefect checks a submitted run's parameters against their JSON schema (types, bounds, unknown
keys); what a schema cannot say (one field against another, a file that must be there) is
checked when the flow starts, before any work, and a parameter that fails ends the run with one
line naming it (:class:`ParameterError`). Resuming is the pipeline's: a finished output with
the same key is reused (:mod:`codepost.pipeline.stages`).
"""

from __future__ import annotations

import base64
import functools
import inspect
import logging
import re
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ValidationError

from ..pipeline.data.problem_sets import ProblemSet, check_problem_files
from ..pipeline.inference.sampling import WeightSyncError
from ..pipeline.launch import LaunchConfig, launch_stage, launches
from ..pipeline.model_config import ModelNotFoundError, resolve_model
from ..pipeline.post_train import PostTrainConfig, run_post_train
from ..pipeline.reporting.report import stage_rows
from ..pipeline.stages import STAGES, Artifacts, Stage, run_stage
from ..pipeline.stages.scoring import (
    ScoreConfig,
    merge_shards,
    score_shard,
    scored_path,
    shard_count,
)
from ..sandbox import SandboxUnavailable
from ..settings.config import explain
from .stage_worker import (
    StageWorkerDied,
    in_stage_worker,
    is_own,
    line_level,
    stage_worker,
    stop_stage_worker,
)
from .task_runners import FanOut

ACCELERATOR = "accelerator"
M = TypeVar("M", bound=BaseModel)
# The stages log progress on `codepost.*` loggers; PREFECT_LOGGING_EXTRA_LOGGERS=codepost
# (set by `codepost run` and `codepost serve`) sends them to the flow run's logs.
logging.getLogger("codepost").setLevel(logging.INFO)
TRANSIENT = (SandboxUnavailable, WeightSyncError, StageWorkerDied, ConnectionError, TimeoutError)


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only what a retry can fix: the sandbox or the engine, not bad input."""
    try:
        state.result()
    except TRANSIENT:
        return True
    except Exception:
        return False
    return False


def _key(text: str) -> str:
    """An artifact key: lowercase letters, digits and dashes (the Artifacts page needs them)."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


# Stages take minutes on this CPU and hours on a GPU cluster; a stage past its timeout is
# stopped (its worker's processes killed) and fails. `task.with_options` changes it. Scoring
# needs none: every program has its own time limit in the sandbox.
STAGE_TIMEOUT_S = 24 * 3600


def _stage_task(stage: Stage) -> Any:
    """``stage`` as a task: on ``launch``'s processes when it is rank-aware and asks for more
    than one, else in the flow run's stage worker when it needs the accelerator."""

    def run(
        config: Any, inputs: Artifacts, out_dir: str, label: str, launch: LaunchConfig | None
    ) -> Artifacts:
        if launch is not None and launches(stage, launch):
            stop_stage_worker()  # what it holds on the accelerator is the ranks' to use
            outputs = launch_stage(stage, config, inputs, Path(out_dir), launch, _log_line)
        elif stage.accelerator:
            outputs = _in_worker(stage.run, config, inputs, Path(out_dir))
        else:
            outputs = stage.run(config, inputs, Path(out_dir))
        _publish_artifacts(stage, Path(out_dir), outputs, label)
        return outputs

    return task(
        name=stage.name,
        tags=[ACCELERATOR] if stage.accelerator else [],
        retries=2,
        retry_delay_seconds=10,
        retry_condition_fn=_transient,
        timeout_seconds=STAGE_TIMEOUT_S,
    )(run)


STAGE_TASKS = {name: _stage_task(stage) for name, stage in STAGES.items()}


def execute_as_task(
    stage: Stage,
    config: Any,
    inputs: Artifacts,
    out_dir: Path,
    label: str,
    launch: LaunchConfig | None = None,
) -> Artifacts:
    """The pipeline's executor in a flow run: the stage's task (the run loop stays in the flow)."""
    run = STAGE_TASKS[stage.name].with_options(task_run_name=label)
    return run(config, inputs, str(out_dir), label, launch)


def _log_line(line: str) -> None:
    """A line of a stage's output in this task run's logs, at the level it was logged at;
    codepost's own marked so (a terminal shows those, and libraries' warnings only)."""
    get_run_logger().log(line_level(line), line, extra={"codepost": is_own(line)})


def _in_worker(function: Any, *args: Any) -> Any:
    """``function(*args)`` in the flow run's stage worker, its output in this task run's logs."""
    return in_stage_worker(function, *args, forward=_log_line)


def _publish_artifacts(stage: Stage, out_dir: Path, outputs: Artifacts, label: str) -> None:
    """What the UI shows of a finished stage: an evaluation's table, or a summary of the
    outputs with the plots the stage drew."""
    if outputs.evaluation is not None:  # label: <stage>/<benchmark>
        evaluated, _, benchmark = label.rpartition("/")
        create_table_artifact(
            stage_rows({benchmark: {evaluated: Path(outputs.evaluation)}}),
            key=_key(f"eval-{label}"),
            description=f"{evaluated} on {benchmark}",
        )
        return
    lines = [f"# {label} ({stage.name})", ""]
    lines += [f"- {kind}: `{path}`" for kind, path in outputs.present().items()]
    lines += [
        "",
        *(f"![{png.stem.replace('_', ' ')}]({png.name})" for png in sorted(out_dir.glob("*.png"))),
    ]
    create_markdown_artifact(
        _with_plots_inlined("\n".join(lines), out_dir),
        key=_key(f"{label}-summary"),
        description=stage.description,
    )


def _with_plots_inlined(markdown: str, folder: Path) -> str:
    """The UI cannot read this machine's files: each PNG that ``markdown`` shows (relative to
    ``folder``) is embedded as a data URI, with the file's path under it."""

    def inline(match: re.Match[str]) -> str:
        alt, path = match[1], (folder / match[2]).resolve()
        if not path.is_file():
            return f"{alt}: `{path}` (not written)"
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{alt}](data:image/png;base64,{data})\n\n`{path}`"

    return re.sub(r"!\[([^\]]*)\]\(([^)]+\.png)\)", inline, markdown)


class ParameterError(ValueError):
    """A flow run's parameter it cannot run with; one line, naming the parameter, the key in it
    and the value where there is one: the failed run's message in the UI."""


def _validated(value: Any, kind: type[M], parameter: str) -> M:
    """``parameter`` as ``kind``, with every problem set it names there and readable. A model
    passed in is validated again (a copy with updates is not) and kept as given: which fields
    it sets is what a run derives from (a stage's seed, the run's model under a stage's own
    settings), and a dump sets them all."""
    data = value if isinstance(value, dict) else value.model_dump()
    try:
        config = kind.model_validate(data)
    except ValidationError as exc:
        errors = explain(exc, kind, data, [], None).splitlines()
        raise ParameterError(f"{parameter}: {'; '.join(errors)}") from None
    if isinstance(value, kind):
        config = value
    try:
        check_problem_files(config)
    except (ValueError, OSError) as exc:
        raise ParameterError(f"{parameter}: {exc}") from None
    return config


def _check_input(kind: str, value: str) -> None:
    """An input artifact named by a flow's parameter: a checkpoint is a model folder or a
    model's name; any other kind a file or folder that is there."""
    try:
        if kind == "checkpoint":
            resolve_model(value)
        elif not Path(value).exists():
            raise FileNotFoundError(f"no such file or folder: {value}")
    except FileNotFoundError as exc:  # ModelNotFoundError is one
        raise ParameterError(f"{kind}: {exc}") from None


def _worker_log(out_dir: str | Path) -> Path:
    """Next to a stage's output, not in it: a published checkpoint replaces its folder."""
    out_dir = Path(out_dir)
    return out_dir.parent / "logs" / f"{out_dir.name}-stage-worker.log"


def _flow_for(stage: Stage) -> Any:
    """``stage`` as a flow: the inputs it needs, its config, an output folder, its processes
    (a rank-aware stage), and the optional inputs; it returns the path of its first output
    (``stage.makes[0]``)."""
    kinds = [*stage.needs, *(k for k in stage.uses if k not in stage.needs)]
    parameters = [
        inspect.Parameter(kind, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
        for kind in stage.needs
    ]
    parameters += [
        inspect.Parameter(
            "config",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=stage.config(),
            annotation=stage.config,
        ),
        inspect.Parameter(
            "out_dir",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=f"runs/{stage.name}",
            annotation=str,
        ),
    ]
    if stage.multi_process:  # how many processes it runs on
        parameters.append(
            inspect.Parameter(
                "launch",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=LaunchConfig(),
                annotation=LaunchConfig,
            )
        )
    parameters += [
        inspect.Parameter(kind, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                          annotation=str | None)
        for kind in kinds if kind not in stage.needs
    ]  # fmt: skip
    signature = inspect.Signature(parameters, return_annotation=str | None)

    def run(*args: Any, **kwargs: Any) -> str | None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        config = _validated(given["config"], stage.config, "config")
        launch = (
            _validated(given["launch"], LaunchConfig, "launch") if stage.multi_process else None
        )
        inputs = Artifacts(**{kind: given[kind] for kind in kinds})
        for kind, path in inputs.present().items():
            _check_input(kind, path)
        execute = functools.partial(execute_as_task, launch=launch)
        with stage_worker(_worker_log(given["out_dir"])):
            outputs = run_stage(stage, config, inputs, Path(given["out_dir"]), execute)
        return getattr(outputs, stage.makes[0])

    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": str | None}
    run.__name__ = run.__qualname__ = f"{stage.name}_flow"
    run.__doc__ = f"The {stage.name} stage: {stage.description}."
    return flow(name=stage.name, description=run.__doc__, validate_parameters=False)(run)


# validate_parameters=False: each flow checks its parameters itself (_validated), to fail with
# one line naming the parameter rather than Prefect's pydantic report.
@flow(name="post-train", validate_parameters=False)
def post_train(config: PostTrainConfig = PostTrainConfig()) -> dict[str, Any]:  # noqa: B008
    """The registered stages of ``config`` in order, with pass@k after every stage that trains."""
    config = _validated(config, PostTrainConfig, "config")
    try:
        config.model.resolve()
    except ModelNotFoundError as exc:
        raise ParameterError(f"config: {exc}") from None
    with stage_worker(Path(config.run_dir) / "logs" / "stage-worker.log"):
        result = run_post_train(config, execute_as_task)
    report = Path(result.report)
    create_markdown_artifact(
        _with_plots_inlined(report.read_text(), report.parent),
        key="post-train-report",
        description=f"{config.run_dir}: pass@1 per stage",
    )
    create_table_artifact(result.rows, key="pass-at-1-per-stage")
    return result.model_dump()


@task(name="score-shard", retries=2, retry_delay_seconds=10, retry_condition_fn=_transient)
def score_shard_task(
    config: ScoreConfig, rollouts: str, problems: ProblemSet, out_dir: str, shard: int, shards: int
) -> str:
    return str(score_shard(config, Path(rollouts), problems, Path(out_dir), shard, shards))


@flow(name="score-shards")
def score_shards_flow(
    config: ScoreConfig, rollouts: str, problems: ProblemSet, out_dir: str, shards: int
) -> str:
    """One task per shard on the flow's task runner, then the shards merged in order."""
    futures = score_shard_task.map(
        unmapped(config),
        unmapped(rollouts),
        unmapped(problems),
        unmapped(out_dir),
        range(shards),
        unmapped(shards),
    )
    return str(merge_shards([Path(path) for path in futures.result()], Path(out_dir)))


@flow(name="score", validate_parameters=False)
def score_flow(
    rollouts: str,
    problems: ProblemSet = ProblemSet(),  # noqa: B008
    config: ScoreConfig = ScoreConfig(),  # noqa: B008
    out_dir: str = "runs/score",
    fan_out: FanOut = FanOut(),  # noqa: B008
) -> str:
    """Score a rollouts file across ``fan_out``'s task runner (threads here, or a Dask or Ray
    cluster: several machines); reused when it is already scored."""
    config, fan_out = (
        _validated(config, ScoreConfig, "config"),
        _validated(fan_out, FanOut, "fan_out"),
    )
    problems = _validated(problems, ProblemSet, "problems")
    _check_input("rollouts", rollouts)
    scored = scored_path(Path(out_dir))
    if scored.is_file():
        return str(scored)
    shards = shard_count(Path(rollouts), fan_out.shards)
    on_runner = score_shards_flow.with_options(task_runner=fan_out.build())
    return on_runner(config, rollouts, problems, out_dir, shards)


STAGE_FLOWS = (post_train, *(_flow_for(stage) for stage in STAGES.values()), score_flow)
# Each stage's flow is a module attribute (`sft_flow`, ...), so deployments find it by name.
globals().update({f.fn.__name__: f for f in STAGE_FLOWS})
