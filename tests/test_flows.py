"""The Prefect flows on a real (ephemeral) Prefect API: post-train chains the stages, leaves
its report and artifacts, refuses bad parameters, and a second run resumes instead of
recomputing."""

from __future__ import annotations

import builtins
import json
import logging
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from engines import saved_tiny_model
from processes import wait_until
from safetensors.torch import load_file

from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.model_config import ModelConfig
from codepost.pipeline.post_train import PostTrainConfig, derive_seed
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.verifiers import RewardConfig

HF = EngineConfig(backend="hf")


@pytest.fixture
def tiny_config(tmp_path):
    problems = ProblemSet(limit=3)
    tiny = saved_tiny_model(tmp_path / "tiny")
    return PostTrainConfig(
        run_dir=str(tmp_path / "run"),
        model=ModelConfig(name_or_path=tiny.name_or_path, lora_dropout=0.1),
        stages=[
            {
                "stage": "rl",
                "config": RLConfig(
                    problems=problems,
                    prompt_style="continuation",
                    iterations=2,
                    prompts_per_iteration=2,
                    # the tiny model never passes: its groups differ in the length term only
                    dynamic_sampling_metric="reward",
                    sampling=SamplingConfig(num_generations=2, max_tokens=8, seed=5),
                    engine=HF,
                    scoring=ScoreConfig(
                        workers=2,
                        reward=RewardConfig(
                            weights={"test": 1.0, "length": 1.0},
                            params={"length": {"budget": 1}},
                        ),
                    ),
                    update=UpdateConfig(learning_rate=1e-2),
                ),
            }
        ],
        evaluations={
            "tiny": EvalConfig(
                problems=problems,
                prompt_style="continuation",
                sampling=SamplingConfig(max_tokens=8),
                engine=HF,
            )
        },
    )


def _evaluation(run_dir: str, stage: str) -> Path:
    (found,) = Path(run_dir).glob(f"{stage}/eval/tiny/*/evaluation.json")
    return found


def _logged_messages() -> list[str]:
    """Every log line the Prefect server holds (its API hands them out 200 at a time)."""
    from prefect.client.orchestration import get_client

    messages: list[str] = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(limit=200, offset=len(messages)):
            messages += [log.message for log in page]
    return messages


@pytest.mark.docker
def test_post_train_runs_the_stages_and_a_second_run_resumes(prefect_api, tiny_config):
    from prefect.artifacts import Artifact
    from prefect.logging.handlers import APILogHandler

    from codepost.flows.post_train import post_train

    to_api = APILogHandler()  # as PREFECT_LOGGING_EXTRA_LOGGERS=codepost (codepost run) sets
    logging.getLogger("codepost").addHandler(to_api)
    try:
        result = post_train(tiny_config)
    finally:
        logging.getLogger("codepost").removeHandler(to_api)
    run_dir = tiny_config.run_dir
    rl_dir = Path(result["checkpoint"]).parents[1]  # rl/<key>/checkpoints/iteration-0002
    assert rl_dir.parent == Path(run_dir) / "rl"
    assert result["checkpoint"] == str(rl_dir / "checkpoints" / "iteration-0002")
    assert [(row["benchmark"], row["stage"]) for row in result["rows"]] == [
        ("tiny", "base"),
        ("tiny", "rl"),
    ]
    # seeds the stage does not write are derived from the run seed, the one it writes is kept,
    # and the run's model holds where the stage sets nothing of its own
    rl = json.loads(rl_dir.with_suffix(".json").read_text())["config"]
    assert rl["seed"] == rl["engine"]["seed"] == derive_seed(0, "rl") != 0
    assert (rl["sampling"]["seed"], rl["model"]["lora_dropout"]) == (5, 0.1)
    report = Path(f"{run_dir}/report.md").read_text()
    assert "## tiny" in report and "| base |" in report and "| rl |" in report
    # the UI shows the plots: embedded, as it cannot read this machine's files
    assert "![pass@1 per stage](data:image/png;base64," in Artifact.get("post-train-report").data
    assert "![reward curve](data:image/png;base64," in Artifact.get("rl-summary").data
    assert Artifact.get("eval-rl-tiny") is not None
    # the task logs show the run's steps and the stage worker's progress, as lines
    messages = _logged_messages()
    assert "[2/3] rl: started (run " in " ".join(messages)
    assert any(m.startswith("rl: iterations: 2/2 in ") for m in messages), messages

    metrics_before = (rl_dir / "metrics.jsonl").read_text()
    eval_before = _evaluation(run_dir, "rl")
    base_before = _evaluation(run_dir, "base").read_text()
    (entry,) = tiny_config.stages
    longer_rl = entry.model_copy(
        update={"config": entry.config.model_copy(update={"iterations": 3})}
    )
    longer = tiny_config.model_copy(update={"stages": [longer_rl]})
    result = post_train(longer)
    metrics_after = (rl_dir / "metrics.jsonl").read_text()
    assert metrics_after.startswith(metrics_before)  # iterations 1-2 were not recomputed
    assert len(metrics_after.splitlines()) == 3
    assert result["checkpoint"] == str(rl_dir / "checkpoints" / "iteration-0003")
    assert _evaluation(run_dir, "base").read_text() == base_before  # the base evaluation was reused
    # the new checkpoint is evaluated into a folder of its own; the old evaluation is kept
    (eval_after,) = set(Path(run_dir).glob("rl/eval/tiny/*/evaluation.json")) - {eval_before}
    assert json.loads(eval_after.read_text())["checkpoint"] == result["checkpoint"]
    assert eval_before.is_file()

    from codepost.flows.post_train import update_flow
    from codepost.pipeline.checkpoints.manifest import read_manifest

    update = {"model": {"name_or_path": result["checkpoint"]}, "update": {"learning_rate": 1e-2}}
    rollouts = rl_dir / "rollouts" / "iteration-0003.parquet"
    updated = update_flow(str(rollouts), update, f"{run_dir}/u")
    assert read_manifest(Path(updated)).version == "policy-0003"
    assert "update" in Path(f"{run_dir}/logs/u-stage-worker.log").read_text()  # its output
    # the same update on 2 processes (a rank-aware stage's flow takes `launch`): its ranks, not
    # the stage worker, compute the same weights
    on_two = update_flow(str(rollouts), update, f"{run_dir}/u2", launch={"num_processes": 2})
    assert not Path(f"{run_dir}/logs/u2-stage-worker.log").exists()
    one, two = (load_file(Path(c) / "model.safetensors") for c in (updated, on_two))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=0.05 * 1e-2)  # lr: 1e-2


def test_invalid_parameters_are_refused_in_one_line_naming_the_parameter(prefect_api, tmp_path):
    """What a parameter's JSON schema cannot say (a gate's benchmark against the run's
    evaluations, a file that must be there, one field against another) fails the run when it
    starts, before any work, in one line naming the parameter, its key and value."""
    from codepost.flows.nightly import nightly
    from codepost.flows.post_train import post_train, score_flow

    series = {"root": str(tmp_path / "series")}
    refused = {
        "config: stages[0].config.iterations = 0: Input should be greater than or equal to 1": (
            post_train, {"config": {"stages": [{"stage": "rl", "config": {"iterations": 0}}]}}),
        "config: model '/nonexistent/model': no Hugging Face model folder there (no such folder)": (
            post_train, {"config": {"model": {"name_or_path": "/nonexistent/model"}}}),
        "config: gate: 'held-out' is not one of run.evaluations (['humaneval'])": (
            nightly, {"config": {**series, "gate": {"benchmark": "held-out"}}}),
        f"config: no problem file at {tmp_path / 'gone.jsonl'}": (nightly, {"config": {
            **series, "run": {"evaluations": {"h": {"problems": {"source": str(tmp_path / "gone.jsonl")}}}}}}),
        f"rollouts: no such file or folder: {tmp_path / 'r.parquet'}": (
            score_flow, {"rollouts": str(tmp_path / "r.parquet")}),
        "fan_out: ray_address='auto' is for task_runner='ray', not 'dask'": (score_flow, {
            "rollouts": "r.parquet", "fan_out": {"task_runner": "dask", "ray_address": "auto"}}),
    }  # fmt: skip
    for message, (flow, parameters) in refused.items():
        state = flow(**parameters, return_state=True)
        assert state.is_failed()
        assert state.message == f"Flow run encountered an exception: ParameterError: {message}"
    assert not (tmp_path / "series").exists()  # no night started: no lock, no folder


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _score(rollouts: list[tuple[Any, str]], out_dir: Path, fan_out: Any, timeout_s: float) -> list:
    """The rows of ``rollouts`` (problem, completion) scored by the ``score`` flow."""
    from datasets import Dataset

    from codepost.flows.post_train import score_flow

    rows = [{"prompt_id": problem.task_id, "group_index": i, "completion": text,
             "completion_style": "chat"} for i, (problem, text) in enumerate(rollouts)]  # fmt: skip
    out_dir.mkdir(parents=True)
    Dataset.from_list(rows).to_parquet(str(out_dir / "rollouts.parquet"))
    config = ScoreConfig(workers=1, timeout_s=timeout_s)
    scored = score_flow(str(out_dir / "rollouts.parquet"), ProblemSet(limit=2), config,
                        str(out_dir / "scored"), fan_out)  # fmt: skip
    return Dataset.from_parquet(scored).to_list()


@pytest.mark.docker
@pytest.mark.slow
def test_scoring_gives_the_same_verdicts_on_threads_dask_and_ray(prefect_api, tmp_path):
    """The same rows, in shards on each task runner (Dask's and Ray's on local clusters of 2
    worker processes, each scoring on a warm pool of its own): the same verdicts, in order."""
    from codepost.flows.task_runners import FanOut
    from codepost.pipeline.data.problem_sets import load_problem_set
    from codepost.pipeline.data.prompts import reference_answer

    first, second = load_problem_set(ProblemSet(limit=2)).values()
    rollouts = [
        (first, reference_answer(first)),
        (second, _fenced("def nothing():\n    return None")),
        (second, reference_answer(second)),
        (first, _fenced("def has_close_elements(:")),
        (first, _fenced("def has_close_elements(numbers, threshold):\n    raise KeyError(1)")),
        (second, _fenced("def separate_paren_groups(s):\n    while True:\n        pass")),
        (first, reference_answer(first)),
    ]
    verdicts = {}
    for runner in ("threads", "dask", "ray"):
        fan_out = FanOut(task_runner=runner, workers=2, shards=3)
        scored = _score(rollouts, tmp_path / runner, fan_out, timeout_s=2)
        assert [row["group_index"] for row in scored] == list(range(len(rollouts)))
        shards = list((tmp_path / runner / "scored" / "shards").glob("scored-*-of-0003.parquet"))
        assert len(shards) == 3
        verdicts[runner] = [
            (row["status"], row["passed"], row["pass_fraction"], row["reward"]) for row in scored
        ]
    statuses = [verdict[0] for verdict in verdicts["threads"]]
    assert statuses == ["passed", "failed", "passed", "syntax_error", "runtime_error", "timeout",
                        "passed"]  # fmt: skip
    assert verdicts["dask"] == verdicts["threads"]
    assert verdicts["ray"] == verdicts["threads"]


def _kill_a_shard_mid_batch(killed: list[int]) -> None:
    """Wait for a Ray worker to run a shard on its sandbox pool, then SIGKILL it."""
    import docker

    client = docker.from_env()

    def scoring_worker() -> psutil.Process | None:
        for process in psutil.process_iter(["cmdline"]):
            if "ray::score-shard" in " ".join(process.info["cmdline"] or []):
                owner = f"codepost.owner={socket.gethostname()}:{process.pid}"
                if client.containers.list(filters={"label": owner}):
                    return process
        return None

    assert wait_until(lambda: scoring_worker() is not None, 300)
    worker = scoring_worker()
    assert worker is not None
    worker.kill()
    killed.append(worker.pid)


@pytest.mark.docker
@pytest.mark.slow
def test_a_ray_worker_killed_mid_shard_loses_no_verdict_and_its_shard_runs_again(
    prefect_api, tmp_path
):
    """A Ray worker process SIGKILLed while its shard runs programs: Ray runs the shard again
    on another worker, as the same task run; every row gets the verdict it would have had,
    none of them a sandbox error, and the dead worker's containers are removed."""
    import docker
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterName,
        TaskRunFilterStartTime,
    )

    from codepost.flows.task_runners import FanOut
    from codepost.pipeline.data.problem_sets import load_problem_set
    from codepost.pipeline.data.prompts import reference_answer

    first, second = load_problem_set(ProblemSet(limit=2)).values()
    # each program sleeps 2 s before it answers: a shard of 3 runs 6 s on its pool of 1
    sleep = "```python\nimport time\ntime.sleep(2)\n"
    slow = [(p, reference_answer(p).replace("```python\n", sleep)) for p in [first, second] * 3]
    killed: list[int] = []
    killer = threading.Thread(target=_kill_a_shard_mid_batch, args=(killed,), daemon=True)
    killer.start()
    fan_out = FanOut(task_runner="ray", workers=2, shards=2)
    started = datetime.now(timezone.utc)  # the server holds other tests' shards too
    scored = _score(slow, tmp_path / "killed", fan_out, timeout_s=10)
    killer.join()

    assert len(killed) == 1
    assert [(row["group_index"], row["status"]) for row in scored] == [
        (i, "passed") for i in range(6)
    ]
    with get_client(sync_client=True) as client:
        shards = client.read_task_runs(
            task_run_filter=TaskRunFilter(
                name=TaskRunFilterName(like_="score-shard"),
                start_time=TaskRunFilterStartTime(after_=started),
            )
        )
        runs = {
            run.name: [s.type.value for s in client.read_task_run_states(run.id)]
            for run in shards
            if not run.name.startswith("score-shards")  # the subflow's own task run
        }
    assert len(runs) == 2 and all(states[-1] == "COMPLETED" for states in runs.values()), runs
    assert sorted(states.count("RUNNING") for states in runs.values()) == [1, 2], runs
    assert builtins.print.__module__ == "builtins"  # Ray left the process's print alone
    owner = f"codepost.owner={socket.gethostname()}:{killed[0]}"
    assert wait_until(
        lambda: not docker.from_env().containers.list(all=True, filters={"label": owner}), 30
    )


def test_a_night_publishes_its_decision_and_a_locked_series_cancels_a_night(prefect_api, tmp_path):
    """A night already decided is not run again: the flow publishes its decision and the
    series' history. A night that finds the series locked ends Cancelled, and runs nothing."""
    from prefect.artifacts import Artifact

    from codepost.flows.nightly import nightly
    from codepost.pipeline.nightly import Decision, NightlyConfig, NightRecord, Spend
    from codepost.pipeline.nightly.history import write_history
    from codepost.pipeline.nightly.records import read_history
    from codepost.pipeline.run_lock import run_folder_lock

    config = NightlyConfig(root=str(tmp_path), series="s", run=PostTrainConfig(stages=[]))
    decision = Decision(
        promoted=False,
        reason="no significant gain",
        champion="base",
        alpha=0.05,
        spend=Spend.of(0.05, 2),
    )
    record = NightRecord(series="s", night="n1", started_from="base", decision=decision)
    record.write(config.series_dir / "n1")
    write_history(config.series_dir, read_history(config.series_dir))

    assert nightly("n1", config) == record.model_dump(mode="json")
    published = Artifact.get("s-decision").data
    assert "# s, night n1: kept the champion" in published
    assert "- level: 0.00571, night 2 tested against this champion (0.0262 of alpha" in published
    assert "data:image/png;base64," in Artifact.get("s-history").data
    with run_folder_lock(config.series_dir):
        state = nightly("n2", config, return_state=True)
    assert state.is_cancelled() and "another night of this series is running" in state.message
    assert not (config.series_dir / "n2").exists()
