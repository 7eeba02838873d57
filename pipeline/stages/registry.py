"""The stage registry: a stage declares its name, its config class, the artifacts it needs and
makes, whether it needs the accelerator, and its ``run(config, inputs, out_dir) -> outputs``;
:func:`.resume.run_stage` runs it under the one resume rule. Also here, what stages share to
read each other's outputs: a checkpoint's weights, the problems a filter kept."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ...settings.registry import Registry
from ..code_version import code_files
from ..data.problem_sets import ProblemSet

log = logging.getLogger("codepost.stages")

Kind = Literal["checkpoint", "problems", "scored", "pairs", "reward_model", "evaluation"]
# A problems artifact is a published folder with its problems in this file (those to train
# on), and the problems a filter set aside in the other.
PROBLEMS_FILE = "problems.jsonl"
HELD_OUT_FILE = "held_out.jsonl"
Part = Literal["train", "held_out"]


class Artifacts(BaseModel):
    """What stages hand each other, by kind: paths (a checkpoint may also be a model name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint: str | None = None
    problems: str | None = None
    scored: str | None = None
    pairs: str | None = None
    reward_model: str | None = None
    evaluation: str | None = None

    def present(self) -> dict[str, str]:
        return {kind: path for kind, path in self.model_dump().items() if path is not None}


RunFunction = Callable[[Any, Artifacts, Path], Artifacts]


@dataclass(frozen=True)
class Stage:
    name: str
    config: type[BaseModel]
    run: RunFunction
    needs: tuple[Kind, ...]
    makes: tuple[Kind, ...]
    uses: tuple[Kind, ...] = ()  # optional inputs (a filter's problems)
    accelerator: bool = True
    # run() is rank-aware: under ``accelerate launch`` every rank computes and only the main
    # process writes (see ``pipeline.launch``); other stages run in one process only.
    multi_process: bool = False
    extendable: tuple[str, ...] = ()
    description: str = ""
    # Raises ValueError when ``config`` cannot take inputs made by these stages (kind -> the
    # stage that makes it), so a run is refused before it starts, not after hours.
    check_inputs: Callable[[Any, dict[str, str]], None] | None = None
    # Whether ``config`` sets part of the problems it makes aside for evaluation (a filter's
    # held-out part): a run refuses a later stage that could train on them (``post_train``).
    holds_out: Callable[[Any], bool] | None = None

    def code_files(self) -> dict[str, str]:
        """The code the stage runs: its module and the package modules it imports, each
        file's hash by its path."""
        return code_files(Path(inspect.getsourcefile(self.run) or ""))


class Executor(Protocol):
    """Runs a stage somewhere (here, or as a Prefect task in a stage worker); ``label`` names
    the run of it (``sft``, ``rl/humaneval`` for an evaluation)."""

    def __call__(
        self, stage: Stage, config: Any, inputs: Artifacts, out_dir: Path, label: str
    ) -> Artifacts: ...


STAGES: Registry[Stage] = Registry("stage")


def register(stage: Stage) -> Stage:
    return STAGES.register(stage.name, stage)


def get_stage(name: str) -> Stage:
    return STAGES[name]


class StaleOutputError(RuntimeError):
    """A finished output no longer matches what was recorded for it (corrupt or edited)."""


def with_weights(config: Any, checkpoint: str | None) -> Any:
    """``config`` loading ``checkpoint``'s weights, its own ``model`` settings kept."""
    if checkpoint is None:
        return config
    return config.model_copy(
        update={"model": config.model.model_copy(update={"name_or_path": checkpoint})}
    )


def filtered_problem_set(out_dir: Path, like: ProblemSet, part: Part = "train") -> ProblemSet:
    """The problems a finished filter (its ``out_dir``) kept (``part``: those to train on, or
    those held out), as a problem set with ``like``'s order and limit."""
    name = PROBLEMS_FILE if part == "train" else HELD_OUT_FILE
    return like.model_copy(
        update={"source": str(Path(out_dir) / "problems" / name), "split": "all"}
    )


def kept_problems(config: Any, problems: str | None) -> Any:
    """``config`` with the problems a filter kept to train on (``problems``, its published
    folder), in the order and limit of ``config.problems``; unchanged without a filter."""
    if problems is None:
        return config
    kept = filtered_problem_set(Path(problems).parent, config.problems)
    listed = Path(kept.source)
    limit = config.problems.limit
    if limit is not None and listed.is_file():
        count = sum(1 for line in listed.read_text().splitlines() if line.strip())
        if count > limit:  # a stage's default cap (rollouts: 16) is easy to miss
            log.warning(
                "%d of the %d problems the filter kept to train on (problems.limit %d); "
                "problems.limit: null takes them all",
                limit,
                count,
                limit,
            )
    return config.model_copy(update={"problems": kept})
