"""Nights without a model, for the series' own logic (tags, records, retention, the gate's
checks, the alpha each night spends) in seconds: the night, its run, the stages' resume rule
and the checkpoint catalog are the real ones; only the stage executor is fake. Its ``sft``
publishes a checkpoint that knows the answers of the problems it trained on, as they were
then; its ``evaluate`` scores a checkpoint on the problems as they are now (a model name knows
nothing). The real series, with a model and the Docker sandbox: tests/test_nightly.py. Also
the gate's comparison of two hand-made evaluations (:func:`greedy_comparison`)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evaluation_helpers import outcomes, write_evaluation

from codepost.pipeline.checkpoints.catalog import Entry, tag
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish
from codepost.pipeline.data.problem_sets import ProblemSet, fingerprint, load_problem_set
from codepost.pipeline.inference.sampling import EngineConfig
from codepost.pipeline.launch import LaunchConfig
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.nightly import Comparison, GateConfig, NightlyConfig, run_night, series
from codepost.pipeline.nightly.gate import compare
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.reporting.report import load_evaluation
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.registry import Artifacts, Stage
from codepost.pipeline.stages.sft import SFTStageConfig

ANSWERS = "answers.json"
PROBLEMS = 6  # 6 gained, 0 lost: one-sided exact McNemar p = 1/64 < 0.0205 (a first night)


def greedy_comparison(
    folder: Path,
    gained: int,
    lost: int,
    both: int = 3,
    neither: int = 3,
    margin: float | None = None,
) -> Comparison:
    """The gate's comparison of evaluations of the champion and the night on the same
    problems: ``gained`` solved by the night only, ``lost`` by the champion only (with a
    guard's ``margin``, its non-inferiority test too)."""
    n = gained + lost + both + neither
    champion = set(range(gained, gained + lost + both))
    night = set(range(gained)) | set(range(gained + lost, gained + lost + both))
    folders = [
        write_evaluation(folder / name, name, outcomes(solved, n))
        for name, solved in (("champion", champion), ("night", night))
    ]
    evaluations = (load_evaluation(f) for f in folders)
    return compare("bench", *evaluations, GateConfig(), margin=margin)


def write_problems(path: Path, answer: int = 1) -> Path:
    """Six HumanEval-style problems whose answer is ``return <answer>``."""
    rows = [
        {
            "task_id": f"ones/{i}",
            "prompt": f"def one_{i}():\n    return ",
            "canonical_solution": f"{answer}\n",
            "test": f"def check(candidate):\n    assert candidate() == {answer}\n",
            "entry_point": f"one_{i}",
        }
        for i in range(PROBLEMS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _answers(problems: ProblemSet) -> dict[str, str]:
    """Each problem's task id -> the hash of its content: what a checkpoint that learned it
    knows."""
    return {task: fingerprint({task: p}) for task, p in load_problem_set(problems).items()}


def fake_execute(
    stage: Stage,
    config: Any,
    inputs: Artifacts,
    out_dir: Path,
    label: str,
    launch: LaunchConfig | None = None,
) -> Artifacts:
    """The run's executor without a model: ``sft`` and ``evaluate`` only."""
    if stage.name == "sft":
        answers = _answers(config.problems)
        manifest = CheckpointManifest(stage="sft", version="1", parent=inputs.checkpoint)
        publish(
            out_dir, lambda folder: (folder / ANSWERS).write_text(json.dumps(answers)), manifest
        )
        return Artifacts(checkpoint=str(out_dir))
    if stage.name == "evaluate":
        assert inputs.checkpoint is not None
        known = Path(inputs.checkpoint) / ANSWERS
        knows = json.loads(known.read_text()) if known.is_file() else {}
        greedy = {task: knows.get(task) == sha for task, sha in _answers(config.problems).items()}
        problems = fingerprint(load_problem_set(config.problems))
        write_evaluation(out_dir, inputs.checkpoint, greedy, fingerprint=problems)
        return Artifacts(evaluation=str(out_dir))
    raise ValueError(f"fake_execute runs sft and evaluate, not {stage.name}")


def fake_series(folder: Path, keep_nights: int = 3) -> NightlyConfig:
    """A series that trains on ``train.jsonl`` and is gated on ``ones.jsonl`` (the same six
    problems, until a test edits one): night 1 gains all six."""
    train, benchmark = (
        ProblemSet(source=str(write_problems(folder / name)), split="all")
        for name in ("train.jsonl", "ones.jsonl")
    )
    run = PostTrainConfig(
        model=ModelConfig(name_or_path="blank"),
        stages=[{"stage": "sft", "config": SFTStageConfig(problems=train)}],
        evaluations={"ones": EvalConfig(problems=benchmark, engine=EngineConfig(backend="hf"))},
    )
    return NightlyConfig(
        root=str(folder / "series"), series="ones", run=run, keep_nights=keep_nights
    )


BEFORE_THE_TAG, AFTER_THE_TAG = "before the tag moves", "after the tag moved"


def stopping_tag(point: str, stop: Callable[[], object]) -> Callable[..., Entry]:
    """The registry's ``tag`` with ``stop()`` (a kill, a crash) at ``point``: the two steps of
    a promotion the series must survive a stop between."""

    def stopping(*args: Any, **kwargs: Any) -> Entry:
        if point == BEFORE_THE_TAG:
            stop()
        entry = tag(*args, **kwargs)
        stop()
        return entry

    return stopping


if __name__ == "__main__":  # python nightly_helpers.py CONFIG.json NIGHT POINT: a killed night
    config_file, night, point = sys.argv[1:]
    series.tag = stopping_tag(point, lambda: os.kill(os.getpid(), signal.SIGKILL))
    run_night(NightlyConfig.model_validate_json(Path(config_file).read_text()), night, fake_execute)
