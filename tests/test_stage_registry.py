"""The one resume rule, on a stage registered here (a new stage needs nothing else): the same
key is reused, a changed config or input is computed into a new folder with the reason logged
(a problems file, a model file, the sandbox image the config names included), extending a run
continues it, and a corrupted output or input checkpoint is refused naming the file. And the
run folder lock."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from codepost.pipeline.checkpoints.manifest import CheckpointManifest, ManifestMismatch, publish
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock
from codepost.pipeline.stages import STAGES, evaluation, get_stage
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.registry import Artifacts, Stage, StaleOutputError, register
from codepost.pipeline.stages.resume import run_stage
from codepost.pipeline.stages.scoring import SandboxSettings, ScoreConfig
from codepost.sandbox import DEFAULT_IMAGE, SandboxUnavailable

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


class ReadsConfig(BaseModel):
    """A toy stage's config naming what it reads outside itself, as real stages' configs do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problems: ProblemSet
    model: ModelConfig = Field(default_factory=ModelConfig)
    sandbox: list[SandboxSettings] = Field(default_factory=list)


def copy_problems(config: ReadsConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "problems.jsonl").write_text(Path(config.problems.source).read_text())
    return Artifacts(evaluation=str(out_dir))


READS = Stage(name="toy-reads", config=ReadsConfig, run=copy_problems, needs=(),
              uses=("checkpoint",), makes=("evaluation",), accelerator=False)  # fmt: skip
# One MBPP-shaped problem; its asserts are filled in.
ASSERTS = '{{"task_id": 1, "text": "Add.", "code": "def add(a, b): return a+b", "test_list": {}}}\n'


def write_problems(path: Path, tests: list[str]) -> Path:
    path.write_text(ASSERTS.format(json.dumps(tests)))
    return path


def model_folder(folder: Path, weights: bytes, published: bool) -> Path:
    """A model folder as a stage names it: its config and weights, with a manifest or not."""

    def write(target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text('{"model_type": "toy"}')
        (target / "model.safetensors").write_bytes(weights)

    if published:
        publish(folder, write, CheckpointManifest(stage="toy", version="v1"))
    else:
        write(folder)
    return folder


def test_a_problems_file_edited_in_place_is_computed_anew_naming_the_file(tmp_path, caplog):
    """Every test of the file changed under the same path: the old results were reused."""
    problems = write_problems(tmp_path / "problems.jsonl", ["assert add(1, 2) == 3"])
    config = ReadsConfig(problems=ProblemSet(source=str(problems), split="all"))
    first = run_stage(READS, config, Artifacts(), tmp_path / "o")
    write_problems(problems, ["assert add(2, 2) == 4", "assert add(0, 0) == 0"])
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        second = run_stage(READS, config, Artifacts(), tmp_path / "o")
        again = run_stage(READS, config, Artifacts(), tmp_path / "o")
    assert first != second == again
    assert "add(0, 0)" in (Path(str(second.evaluation)) / "problems.jsonl").read_text()
    assert f"problems file {problems} changed (" in caplog.text
    assert "reusing" in caplog.records[-1].getMessage()


def test_a_model_folder_whose_weights_were_replaced_is_computed_anew_naming_the_file(
    tmp_path, caplog
):
    folder = model_folder(tmp_path / "model", b"weights v1", published=False)
    config = ReadsConfig(
        problems=ProblemSet(source=str(write_problems(tmp_path / "p.jsonl", []))),
        model=ModelConfig(name_or_path=str(folder)),
    )
    first = run_stage(READS, config, Artifacts(), tmp_path / "o")
    (folder / "model.safetensors").write_bytes(b"weights v2, longer")
    with caplog.at_level(logging.INFO, logger="codepost.stages"):
        second = run_stage(READS, config, Artifacts(), tmp_path / "o")
    assert first != second
    assert f"model file {folder}/model.safetensors changed (" in caplog.text
    assert "config.json" not in caplog.text


@pytest.mark.parametrize("named_by", ["the config", "an input"])
def test_a_checkpoint_that_no_longer_matches_its_manifest_is_refused_naming_the_file(
    tmp_path, named_by
):
    """Weights replaced in place under an intact manifest: keyed by the manifest, reused."""
    checkpoint = model_folder(tmp_path / "ckpt", b"weights v1", published=True)
    problems = ProblemSet(source=str(write_problems(tmp_path / "p.jsonl", [])))
    model = ModelConfig(name_or_path=str(checkpoint) if named_by == "the config" else "org/name")
    config, inputs = ReadsConfig(problems=problems, model=model), Artifacts()
    if named_by == "an input":
        inputs = Artifacts(checkpoint=str(checkpoint))
    run_stage(READS, config, inputs, tmp_path / "o")
    (checkpoint / "model.safetensors").write_bytes(b"weights v2, longer")
    with pytest.raises(ManifestMismatch, match=f"{checkpoint}/model.safetensors: sha256 differs"):
        run_stage(READS, config, inputs, tmp_path / "o")
    assert len(list((tmp_path / "o").glob("*.json"))) == 1  # nothing computed on it


def test_a_stage_that_runs_programs_with_no_engine_to_reach_is_refused_naming_it(tmp_path):
    """Its key holds the sandbox image's id: without the engine there is no key to reuse."""
    engine = f"unix://{tmp_path}/no-engine.sock"
    config = ReadsConfig(
        problems=ProblemSet(source=str(write_problems(tmp_path / "p.jsonl", []))),
        sandbox=[SandboxSettings(docker_hosts=[engine])],
    )
    with pytest.raises(SandboxUnavailable, match=f"cannot reach the Docker engine at {engine}"):
        run_stage(READS, config, Artifacts(), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def build_image(name: str, build: str) -> str:
    """A tiny image on the sandbox image, ``name`` a test's own: the id of this build."""
    built = subprocess.run(
        ["docker", "build", "--quiet", "--tag", name, "-"],
        input=f"FROM {DEFAULT_IMAGE}\nLABEL codepost.test.build={build}\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return built.stdout.strip()


@pytest.mark.docker
def test_an_evaluation_on_a_rebuilt_image_or_an_edited_problems_file_is_computed_anew(
    tmp_path, caplog
):
    """The real evaluate stage's key (its run stood in for): an image rebuilt under the same
    name, and a problems file edited in place, are each an input that changed."""
    name = f"codepost-test-resume-{uuid.uuid4().hex[:12]}:latest"
    problems = write_problems(tmp_path / "problems.jsonl", ["assert add(1, 2) == 3"])
    config = EvalConfig(
        problems=ProblemSet(source=str(problems), split="all"),
        scoring=ScoreConfig(sandbox=SandboxSettings(image=name)),
    )
    inputs = Artifacts(checkpoint="embedded:smollm2-135m-instruct")
    evaluate, out = get_stage("evaluate"), tmp_path / "eval"

    def stand_in(stage, config, inputs, out_dir, label):
        out_dir.mkdir(parents=True)
        (out_dir / "evaluation.json").write_text("{}")
        return Artifacts(evaluation=str(out_dir))

    builds = [build_image(name, "one")]
    try:
        first = run_stage(evaluate, config, inputs, out, stand_in)
        assert run_stage(evaluate, config, inputs, out, stand_in) == first
        builds.append(build_image(name, "two"))
        with caplog.at_level(logging.INFO, logger="codepost.stages"):
            rebuilt = run_stage(evaluate, config, inputs, out, stand_in)
        short = [build.removeprefix("sha256:")[:12] for build in builds]
        assert f"sandbox image {name} changed ({short[0]} -> {short[1]})" in caplog.text
        write_problems(problems, ["assert add(2, 2) == 4"])
        with caplog.at_level(logging.INFO, logger="codepost.stages"):
            edited = run_stage(evaluate, config, inputs, out, stand_in)
        assert f"problems file {problems} changed (" in caplog.text
        assert len({first, rebuilt, edited}) == 3 and len(list(out.glob("*.json"))) == 3
    finally:
        subprocess.run(["docker", "rmi", "--force", *builds], capture_output=True, timeout=120)


def test_codepost_evaluate_evaluates_a_problems_file_edited_in_place_again(tmp_path, monkeypatch):
    """Its folder's results are reused for the same checkpoint, settings and problems content:
    an edited file goes on to the model (stood in for here: its loading is where it stops)."""
    problems = write_problems(tmp_path / "problems.jsonl", ["assert add(1, 2) == 3"])
    config = EvalConfig(problems=ProblemSet(source=str(problems), split="all"))
    before = evaluation.EvaluationResults(
        checkpoint="org/model",
        problems_fingerprint=evaluation.fingerprint(evaluation.load_problem_set(config.problems)),
        num_problems=1,
        config=json.loads(config.model_dump_json()),
    )
    before.write(tmp_path / "out" / "evaluation.json")

    def no_model(model):
        raise RuntimeError("evaluated again")

    monkeypatch.setattr(evaluation, "load_tokenizer", no_model)
    assert evaluation.run_evaluate(config, "org/model", tmp_path / "out") == before
    write_problems(problems, ["assert add(2, 2) == 4"])
    with pytest.raises(RuntimeError, match="evaluated again"):
        evaluation.run_evaluate(config, "org/model", tmp_path / "out")
