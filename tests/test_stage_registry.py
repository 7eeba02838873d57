"""The one resume rule, on a stage registered here (a new stage needs nothing else): the same
key is reused, a changed config or input is computed into a new folder with the reason logged,
extending a run continues it, and a corrupted output is refused naming the file. And the run
folder lock."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock
from codepost.pipeline.stages import STAGES
from codepost.pipeline.stages.registry import (
    Artifacts,
    Stage,
    StaleOutputError,
    register,
    run_stage,
)

CALLS: list[tuple[int, int]] = []


class CountConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = 1
    iterations: int = 2


def run_count(config: CountConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    """Appends one line per iteration not yet done (a stage that resumes inside its folder)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = out_dir / "lines.txt"
    lines = done.read_text().splitlines() if done.exists() else []
    start = len(lines)
    for i in range(start, config.iterations):
        lines.append(str(i * config.step))
    done.write_text("\n".join(lines) + "\n")
    CALLS.append((start, config.iterations))
    return Artifacts(scored=str(done))


COUNT = Stage(
    name="count-lines",
    config=CountConfig,
    run=run_count,
    needs=(),
    uses=("checkpoint",),
    makes=("scored",),
    accelerator=False,
    extendable=("iterations",),
    description="a toy stage",
)


@pytest.fixture
def count_stage():
    CALLS.clear()
    register(COUNT)
    yield COUNT
    STAGES.pop(COUNT.name)


def test_the_same_config_and_inputs_are_reused(count_stage, tmp_path):
    first = run_stage(count_stage, CountConfig(), Artifacts(), tmp_path)
    again = run_stage(count_stage, CountConfig(), Artifacts(), tmp_path)
    assert first == again and CALLS == [(0, 2)]
    (record,) = tmp_path.glob("*.json")
    assert json.loads(record.read_text())["outputs"]["scored"]["path"].endswith("lines.txt")


def test_a_changed_config_is_computed_into_a_new_folder_saying_why(count_stage, tmp_path, caplog):
    first = run_stage(count_stage, CountConfig(step=1), Artifacts(), tmp_path)
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        second = run_stage(count_stage, CountConfig(step=5), Artifacts(), tmp_path)
    assert Path(first.scored).read_text() == "0\n1\n"  # not overwritten
    assert Path(second.scored).read_text() == "0\n5\n"
    assert Path(first.scored).parent != Path(second.scored).parent
    assert "step: 1 -> 5" in caplog.text


def test_a_changed_input_is_recomputed(count_stage, tmp_path, caplog):
    model = tmp_path / "model.bin"
    model.write_text("weights v1")
    first = run_stage(count_stage, CountConfig(), Artifacts(checkpoint=str(model)), tmp_path / "o")
    model.write_text("weights v2")
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        second = run_stage(
            count_stage, CountConfig(), Artifacts(checkpoint=str(model)), tmp_path / "o"
        )
    assert first != second and len(CALLS) == 2
    assert "input checkpoint changed" in caplog.text


def test_more_iterations_continue_the_same_folder(count_stage, tmp_path, caplog):
    first = run_stage(count_stage, CountConfig(iterations=2), Artifacts(), tmp_path)
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        longer = run_stage(count_stage, CountConfig(iterations=3), Artifacts(), tmp_path)
    assert first == longer and CALLS == [(0, 2), (2, 3)]  # iterations 1-2 were not recomputed
    assert Path(longer.scored).read_text() == "0\n1\n2\n"
    assert "iterations: 2 -> 3" in caplog.text
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_a_corrupted_output_is_refused_naming_the_file(count_stage, tmp_path):
    first = run_stage(count_stage, CountConfig(), Artifacts(), tmp_path)
    Path(first.scored).write_text("0\n1\nforged\n")
    with pytest.raises(StaleOutputError, match=r"lines\.txt: differs from the digest"):
        run_stage(count_stage, CountConfig(), Artifacts(), tmp_path)
    Path(first.scored).unlink()
    with pytest.raises(StaleOutputError, match=r"lines\.txt: missing"):
        run_stage(count_stage, CountConfig(), Artifacts(), tmp_path)
    assert CALLS == [(0, 2)]


def test_a_second_run_on_a_folder_is_refused_naming_the_holder(tmp_path):
    with (
        run_folder_lock(tmp_path),
        pytest.raises(RunFolderLocked, match=rf"in use by pid {os.getpid()} on "),
        run_folder_lock(tmp_path),
    ):
        pass
    with run_folder_lock(tmp_path):  # released at the end of the first
        pass


def test_a_lock_held_for_inner_runs_covers_them_and_no_one_else(tmp_path):
    """``codepost run`` holds the lock for the flow it starts: the flow's run does not take it
    again; a run in another context (a thread of its own) is refused."""
    refused = []

    def elsewhere() -> None:
        with contextlib.suppress(RunFolderLocked), run_folder_lock(tmp_path):
            return
        refused.append(True)

    with run_folder_lock(tmp_path, for_inner_runs=True):
        with run_folder_lock(tmp_path):  # the run inside
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
        assert refused == [True]
    with pytest.raises(RunFolderLocked), run_folder_lock(tmp_path), run_folder_lock(tmp_path):
        pass  # without it, taking it twice is refused as before


def _hold_lock(run_dir: str, ready) -> None:
    with run_folder_lock(Path(run_dir)):
        ready.set()
        signal.pause()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold_lock, args=(str(tmp_path), ready))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(RunFolderLocked, match=f"pid {holder.pid}"), run_folder_lock(tmp_path):
            pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    with run_folder_lock(tmp_path):
        assert f"pid {os.getpid()}" in (tmp_path / ".lock").read_text()


def publish_weights(config: CountConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish

    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * config.step)

    publish(out_dir, write, CheckpointManifest(stage="toy", version="v1"))
    return Artifacts(checkpoint=str(out_dir))


def write_evaluation(config: CountConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    """A folder output without a manifest, as an evaluation's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evaluation.json").write_text('{"pass@1": 0.25}')
    (out_dir / "samples.jsonl").write_text("{}\n")
    return Artifacts(evaluation=str(out_dir))


def test_an_edited_file_of_a_folder_output_is_refused_naming_that_file(tmp_path):
    """An edited evaluation.json was refused naming only its folder."""
    stage = Stage(name="toy-eval", config=CountConfig, run=write_evaluation, needs=(),
                  makes=("evaluation",), accelerator=False)  # fmt: skip
    first = Path(str(run_stage(stage, CountConfig(), Artifacts(), tmp_path).evaluation))
    (first / "evaluation.json").write_text('{"pass@1": 0.95}')
    (first / "notes.txt").write_text("added")
    with pytest.raises(StaleOutputError) as refused:
        run_stage(stage, CountConfig(), Artifacts(), tmp_path)
    message = str(refused.value)
    assert f"{first / 'evaluation.json'}: differs from its digest" in message
    assert f"{first / 'notes.txt'}: added" in message and "samples.jsonl" not in message


def test_a_corrupted_checkpoint_is_refused_naming_the_file_its_manifest_lists(tmp_path):
    stage = Stage(name="toy-weights", config=CountConfig, run=publish_weights, needs=(),
                  makes=("checkpoint",), accelerator=False)  # fmt: skip
    first = run_stage(stage, CountConfig(), Artifacts(), tmp_path)
    weights = Path(first.checkpoint) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0xFF  # a flipped byte, the manifest untouched
    weights.write_bytes(bytes(data))
    with pytest.raises(StaleOutputError, match=r"model\.safetensors"):
        run_stage(stage, CountConfig(), Artifacts(), tmp_path)
    (Path(first.checkpoint) / "manifest.json").unlink()  # a deleted manifest
    with pytest.raises(StaleOutputError, match="differs from the digest"):
        run_stage(stage, CountConfig(), Artifacts(), tmp_path)
