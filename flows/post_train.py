"""Prefect flows: one per stage, and ``post-train``, which chains them with an evaluation after
each stage.

The stages are plain functions of ``codepost.pipeline``; here they become tasks with retries for
transient failures (the sandbox or the engine), the ``accelerator`` tag (a concurrency limit of
one keeps accelerator-bound work one at a time), and artifacts (a markdown summary, a metrics
table, links to checkpoints and plots). Each stage finds its own finished output and returns it,
so a flow run started again after a crash or a kill resumes after the last finished stage
without recomputing it. Parameters are the stages' pydantic configs: the UI renders them as
forms; they are validated again when the flow starts (the UI cannot run validators).
"""

from __future__ import annotations

import base64
import logging
import re
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from ..pipeline.data.problem_sets import ProblemSet
from ..pipeline.inference.sampling import SampleStageConfig, WeightSyncError, run_sample
from ..pipeline.model_config import ModelNotFoundError
from ..pipeline.post_train import PostTrainConfig, with_checkpoint, with_problems
from ..pipeline.reporting.report import stage_rows, write_report
from ..pipeline.stages.difficulty_filter import (
    DifficultyFilterConfig,
    filtered_problem_set,
    run_difficulty_filter,
)
from ..pipeline.stages.dpo import DPOResult, DPOStageConfig, run_dpo
from ..pipeline.stages.evaluation import EvalConfig, run_evaluate
from ..pipeline.stages.pairs import MinedPairs, PairMiningConfig, run_pair_mining
from ..pipeline.stages.rl import (
    CURVES_FILE,
    RLConfig,
    UpdateStageConfig,
    merge_rollouts,
    run_rl,
    run_update,
)
from ..pipeline.stages.scoring import (
    ScoreConfig,
    merge_shards,
    score_shard,
    scored_path,
    shard_count,
)
from ..pipeline.stages.sft import SFTStageConfig, run_sft
from ..sandbox import SandboxUnavailable
from .stage_worker import (
    StageWorkerDied,
    in_stage_worker,
    line_level,
    stage_worker,
)
from .task_runners import FanOut

ACCELERATOR = "accelerator"
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
stage_task = task(
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=_transient,
    timeout_seconds=STAGE_TIMEOUT_S,
)


def _in_worker(function: Any, *args: Any) -> Any:
    """``function(*args)`` in the flow run's stage worker, its output in this task run's logs."""
    log = get_run_logger()
    return in_stage_worker(function, *args, forward=lambda line: log.log(line_level(line), line))


@stage_task(name="sft", tags=[ACCELERATOR])
def sft_task(config: SFTStageConfig, out_dir: str) -> str:
    checkpoint = str(_in_worker(run_sft, config, Path(out_dir)))
    create_link_artifact_for("sft", checkpoint)
    return checkpoint


@stage_task(name="rl", tags=[ACCELERATOR])
def rl_task(config: RLConfig, out_dir: str) -> str:
    checkpoint = str(_in_worker(run_rl, config, Path(out_dir)))
    summary = (
        f"# RL ({config.update.algorithm})\n\nLast checkpoint: `{checkpoint}`\n\n"
        f"Metrics per iteration: `{Path(out_dir) / 'metrics.jsonl'}`\n\n"
        f"![reward curve]({CURVES_FILE})"
    )
    create_markdown_artifact(
        _with_plots_inlined(summary, Path(out_dir)), key="rl-summary", description="the RL stage"
    )
    return checkpoint


@stage_task(name="difficulty-filter", tags=[ACCELERATOR])
def filter_task(config: DifficultyFilterConfig, out_dir: str) -> str:
    problems = str(_in_worker(run_difficulty_filter, config, Path(out_dir)))
    create_markdown_artifact(
        f"# Difficulty filter\n\nKept problems: `{problems}` (pass rates: "
        f"`{Path(problems).parent / 'pass_rates.json'}`)",
        key="difficulty-filter",
        description="the problems the filter kept",
    )
    return problems


@stage_task(name="sample", tags=[ACCELERATOR])
def sample_task(config: SampleStageConfig, out_dir: str) -> str:
    return str(_in_worker(run_sample, config, Path(out_dir)))


@stage_task(name="update", tags=[ACCELERATOR])
def update_task(config: UpdateStageConfig, scored: str, out_dir: str) -> str:
    checkpoint = str(_in_worker(run_update, config, Path(scored), Path(out_dir)))
    create_link_artifact_for("update", checkpoint)
    return checkpoint


@stage_task(name="score-shard")
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


def score_fanned_out(
    config: ScoreConfig, rollouts: str, problems: ProblemSet, out_dir: str, fan_out: FanOut
) -> str:
    """Score rollouts across ``fan_out``'s task runner (reused when already scored)."""
    scored = scored_path(Path(out_dir))
    if scored.is_file():
        return str(scored)
    shards = shard_count(Path(rollouts), fan_out.shards)
    on_runner = score_shards_flow.with_options(task_runner=fan_out.build())
    return on_runner(config, rollouts, problems, out_dir, shards)


@stage_task(name="mine-pairs")
def mine_task(config: PairMiningConfig, scored: str, out_dir: str) -> MinedPairs:
    mined = run_pair_mining(config, Path(scored), Path(out_dir))
    get_run_logger().info("pairs: %s (%s)", mined.counts, mined.message)
    return mined


@stage_task(name="dpo", tags=[ACCELERATOR])
def dpo_task(config: DPOStageConfig, pairs: str | None, out_dir: str) -> DPOResult:
    result = _in_worker(run_dpo, config, Path(pairs) if pairs else None, Path(out_dir))
    if result.checkpoint is not None:
        create_link_artifact_for("dpo", str(result.checkpoint))
    return result


@stage_task(name="evaluate", tags=[ACCELERATOR])
def evaluate_task(
    config: EvalConfig, checkpoint: str, out_dir: str, benchmark: str, stage: str
) -> dict:
    results = _in_worker(run_evaluate, config, checkpoint, Path(out_dir))
    create_table_artifact(
        stage_rows({benchmark: {stage: Path(out_dir)}}),
        key=_key(f"eval-{stage}-{benchmark}"),
        description=checkpoint,
    )
    return results.to_json()


def create_link_artifact_for(stage: str, checkpoint: str) -> None:
    create_markdown_artifact(
        f"# {stage}\n\nCheckpoint: `{checkpoint}` (manifest: `{checkpoint}/manifest.json`)",
        key=_key(f"{stage}-checkpoint"),
        description=f"the {stage} stage's checkpoint",
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


def _validated(config: Any, kind: type) -> Any:
    """The UI sends plain data and cannot run validators: validate here, naming the problem."""
    return kind.model_validate(config if isinstance(config, dict) else config.model_dump())


def _worker_log(out_dir: str | Path) -> Path:
    """Next to a stage's output, not in it: a published checkpoint replaces its folder."""
    out_dir = Path(out_dir)
    return out_dir.parent / "logs" / f"{out_dir.name}-stage-worker.log"


@flow(name="post-train")
def post_train(
    config: PostTrainConfig = PostTrainConfig(),  # noqa: B008
    fan_out: FanOut = FanOut(),  # noqa: B008
) -> dict[str, Any]:
    """SFT -> RL iterations -> DPO on mined pairs, with pass@1 after every stage."""
    config = _validated(config, PostTrainConfig)
    fan_out = _validated(fan_out, FanOut)
    try:
        config.model.resolve()
    except ModelNotFoundError as exc:
        raise ValueError(f"post-train: {exc}") from None
    with stage_worker(Path(config.run_dir) / "logs" / "stage-worker.log"):
        return _post_train(config, fan_out)


def _post_train(config: PostTrainConfig, fan_out: FanOut) -> dict[str, Any]:
    log = get_run_logger()
    run_dir = Path(config.run_dir)
    checkpoint = config.model.name_or_path
    filtered: Path | None = None  # the problems a filter stage kept

    def evaluate(stage: str, checkpoint: str) -> None:
        for benchmark, evaluation in config.evaluations.items():
            out_dir = run_dir / stage / "eval" / benchmark
            evaluate_task(evaluation, checkpoint, str(out_dir), benchmark, stage)
            evaluations[benchmark][stage] = out_dir

    def problems(like: ProblemSet) -> ProblemSet | None:
        return None if filtered is None else filtered_problem_set(filtered, like)

    evaluations: dict[str, dict[str, Path]] = {benchmark: {} for benchmark in config.evaluations}
    evaluate("base", checkpoint)
    for stage in config.stages:
        log.info("stage %s from %s", stage, checkpoint)
        if stage == "sft":
            sft = with_checkpoint(config.sft, config.model, checkpoint)
            checkpoint = sft_task(sft, str(run_dir / "sft"))
        elif stage == "filter":
            rate = with_checkpoint(config.difficulty_filter, config.model, checkpoint)
            filter_task(rate, str(run_dir / "filter"))
            filtered = run_dir / "filter"
            continue  # no new weights: nothing to evaluate
        elif stage == "rl":
            rl = with_checkpoint(config.rl, config.model, checkpoint)
            rl = with_problems(rl, problems(rl.problems))
            checkpoint = rl_task(rl, str(run_dir / "rl"))
        elif stage == "dpo":
            if config.dpo_pairs_from == "rl":
                scored = str(merge_rollouts(run_dir / "rl"))
            else:
                sample = with_checkpoint(config.dpo_rollouts, config.model, checkpoint)
                sample = with_problems(sample, problems(sample.problems))
                rollouts = sample_task(sample, str(run_dir / "rollouts"))
                scored = score_fanned_out(
                    config.rl.scoring, rollouts, sample.problems, str(run_dir / "rollouts"), fan_out
                )
            mined = mine_task(config.pairs, scored, str(run_dir / "pairs"))
            dpo = with_checkpoint(config.dpo, config.model, checkpoint)
            result = dpo_task(dpo, str(mined.path) if mined.path else None, str(run_dir / "dpo"))
            if result.checkpoint is None:
                log.warning("dpo skipped: %s", mined.message)
                continue
            checkpoint = str(result.checkpoint)
        evaluate(stage, checkpoint)
    report = write_report(run_dir, evaluations)
    create_markdown_artifact(
        _with_plots_inlined(report.read_text(), run_dir),
        key="post-train-report",
        description=f"{run_dir}: pass@1 per stage",
    )
    rows = stage_rows(evaluations)
    create_table_artifact(rows, key="pass-at-1-per-stage")
    return {"checkpoint": checkpoint, "report": str(report), "rows": rows}


@flow(name="sft")
def sft_flow(config: SFTStageConfig = SFTStageConfig(), out_dir: str = "runs/sft") -> str:  # noqa: B008
    with stage_worker(_worker_log(out_dir)):
        return sft_task(_validated(config, SFTStageConfig), out_dir)


@flow(name="rl")
def rl_flow(config: RLConfig = RLConfig(), out_dir: str = "runs/rl") -> str:  # noqa: B008
    with stage_worker(_worker_log(out_dir)):
        return rl_task(_validated(config, RLConfig), out_dir)


@flow(name="difficulty-filter")
def difficulty_filter_flow(
    config: DifficultyFilterConfig = DifficultyFilterConfig(),  # noqa: B008
    out_dir: str = "runs/difficulty-filter",
) -> str:
    """Rate problems by a checkpoint's pass rate and keep those in range (the RL stage's
    ``problems`` can then name the file it returns)."""
    with stage_worker(_worker_log(out_dir)):
        return filter_task(_validated(config, DifficultyFilterConfig), out_dir)


@flow(name="sample")
def sample_flow(
    config: SampleStageConfig = SampleStageConfig(),  # noqa: B008
    out_dir: str = "runs/sample",
) -> str:
    with stage_worker(_worker_log(out_dir)):
        return sample_task(_validated(config, SampleStageConfig), out_dir)


@flow(name="evaluate")
def evaluate_flow(
    checkpoint: str = "embedded:smollm2-135m-instruct",
    config: EvalConfig = EvalConfig(),  # noqa: B008
    out_dir: str = "runs/evaluate",
) -> dict:
    with stage_worker(_worker_log(out_dir)):
        config = _validated(config, EvalConfig)
        return evaluate_task(config, checkpoint, out_dir, "evaluation", "checkpoint")


@flow(name="score")
def score_flow(
    rollouts: str,
    problems: ProblemSet = ProblemSet(),  # noqa: B008
    config: ScoreConfig = ScoreConfig(),  # noqa: B008
    out_dir: str = "runs/score",
    fan_out: FanOut = FanOut(),  # noqa: B008
) -> str:
    config, fan_out = _validated(config, ScoreConfig), _validated(fan_out, FanOut)
    return score_fanned_out(config, rollouts, problems, out_dir, fan_out)


@flow(name="update")
def update_flow(
    scored: str,
    config: UpdateStageConfig = UpdateStageConfig(),  # noqa: B008
    out_dir: str = "runs/update",
) -> str:
    """One policy update on scored rollouts (the ``rl`` flow runs sample, score and update in
    a loop; this is its update alone)."""
    with stage_worker(_worker_log(out_dir)):
        return update_task(_validated(config, UpdateStageConfig), scored, out_dir)


@flow(name="mine-and-dpo")
def mine_and_dpo_flow(
    scored: str,
    pairs: PairMiningConfig = PairMiningConfig(),  # noqa: B008
    config: DPOStageConfig = DPOStageConfig(),  # noqa: B008
    out_dir: str = "runs/dpo",
) -> dict:
    mined = mine_task(_validated(pairs, PairMiningConfig), scored, f"{out_dir}/pairs")
    with stage_worker(_worker_log(out_dir)):
        result = dpo_task(
            _validated(config, DPOStageConfig), str(mined.path) if mined.path else None, out_dir
        )
    return {"pairs": mined.model_dump(mode="json"), "dpo": result.model_dump(mode="json")}


STAGE_FLOWS = (
    post_train,
    sft_flow,
    sample_flow,
    score_flow,
    difficulty_filter_flow,
    rl_flow,
    update_flow,
    mine_and_dpo_flow,
    evaluate_flow,
)
