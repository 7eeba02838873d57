"""The scoring stage: rollouts -> scored rollouts through the verifier; sandbox errors retried,
then counted and scored as the reward config says."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
from fake_executors import InProcessExecutor

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import reference_answer
from codepost.pipeline.stages.scoring import (
    SandboxFailing,
    ScoreConfig,
    run_score,
    score_rollouts,
    summarize,
)
from codepost.sandbox import ExecStatus, ExecutionResult, Job
from codepost.verifiers import RewardConfig

PROBLEMS = load_problem_set(ProblemSet(limit=2))


def rows_for(answers: list[tuple[str, str, str]]) -> list[dict]:
    return [
        {"prompt_id": task_id, "group_index": i, "completion": text, "completion_style": style,
         "completion_ids": [1] * 5}
        for i, (task_id, text, style) in enumerate(answers)
    ]  # fmt: skip


def reference(task_id: str, style: str = "chat") -> tuple[str, str, str]:
    return task_id, reference_answer(PROBLEMS[task_id], style), style


class FlakyExecutor(InProcessExecutor):
    """Fails the first ``failures`` jobs as the infrastructure would, then runs them."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def submit(self, job: Job) -> Future[ExecutionResult]:
        if self.failures > 0:
            self.failures -= 1
            self.jobs.append(job)
            future: Future[ExecutionResult] = Future()
            future.set_result(ExecutionResult(ExecStatus.SANDBOX_ERROR, error="container died"))
            return future
        return super().submit(job)


def test_rows_keep_their_fields_and_gain_scores_in_order():
    rows = rows_for([reference("HumanEval/1"), ("HumanEval/0", "```python\nx = (\n```", "chat"),
                     reference("HumanEval/0", "continuation")])  # fmt: skip
    config = ScoreConfig(reward=RewardConfig(weights={"test": 1.0, "format": 0.5, "syntax": 0.25}))
    scored = score_rollouts(rows, PROBLEMS, config, executor=InProcessExecutor())
    assert [r["group_index"] for r in scored] == [0, 1, 2]
    assert [r["status"] for r in scored] == ["passed", "syntax_error", "passed"]
    assert scored[0]["reward"] == pytest.approx(1 + 0.5 + 0.25)
    assert scored[1]["reward_test"] == 0.0 and scored[1]["reward_syntax"] == 0.0
    assert not any(r["excluded"] for r in scored) and scored[0]["completion_ids"] == [1] * 5


def test_a_sandbox_error_is_retried_before_it_counts():
    executor = FlakyExecutor(failures=2)
    rows = rows_for([reference("HumanEval/0"), reference("HumanEval/1")])
    scored = score_rollouts(rows, PROBLEMS, ScoreConfig(sandbox_retries=1), executor=executor)
    assert [r["status"] for r in scored] == ["passed", "passed"]
    assert len(executor.jobs) == 4


@pytest.mark.parametrize(
    ("mode", "reward", "excluded"), [("fail", 0.0, False), ("exclude", None, True)]
)
def test_a_persistent_sandbox_error_is_counted_and_scored_as_configured(mode, reward, excluded):
    config = ScoreConfig(
        sandbox_retries=2, reward=RewardConfig(sandbox_errors=mode), max_sandbox_error_share=1.0
    )
    executor = FlakyExecutor(failures=100)
    (row,) = score_rollouts(
        rows_for([reference("HumanEval/0")]), PROBLEMS, config, executor=executor
    )
    assert len(executor.jobs) == 3 and row["status"] == "sandbox_error"
    assert row["excluded"] is excluded
    assert math.isnan(row["reward"]) if reward is None else row["reward"] == reward
    summary = summarize([row])
    assert summary["data/sandbox_errors"] == 1
    pass_rate = summary["reward/pass_rate"]  # over the rows kept: none, when it is left out
    assert math.isnan(pass_rate) if excluded else pass_rate == 0.0


@pytest.mark.parametrize(("mode", "excluded"), [("fail", False), ("exclude", True)])
def test_an_episode_the_sandbox_cut_short_is_left_out_as_a_sandbox_error_is(mode, excluded):
    """Its public tests' run failed, so the episode ended before the model saw feedback: its
    final answer's verdict is real, but not what the policy would have reached."""
    rows = rows_for([reference("HumanEval/0"), reference("HumanEval/0")])
    rows[0]["episode_end"], rows[1]["episode_end"] = "sandbox_error", "passed"
    config = ScoreConfig(reward=RewardConfig(sandbox_errors=mode))
    cut, ended = score_rollouts(rows, PROBLEMS, config, executor=InProcessExecutor())
    assert cut["status"] == ended["status"] == "passed" and not ended["excluded"]
    assert cut["excluded"] is excluded and math.isnan(cut["reward"]) is excluded


def test_sandbox_errors_are_left_out_of_the_rewards_by_default():
    assert RewardConfig().sandbox_errors == "exclude"


def test_a_batch_with_more_sandbox_errors_than_its_bound_stops():
    rows = rows_for([reference("HumanEval/0"), reference("HumanEval/1")] * 10)
    executor = FlakyExecutor(failures=1000)
    with pytest.raises(SandboxFailing, match=r"20 of 20 samples .* sandbox errors after 1 ret"):
        score_rollouts(rows, PROBLEMS, ScoreConfig(sandbox_retries=1), executor=executor)
    config = ScoreConfig(sandbox_retries=0, max_sandbox_error_share=0.05)
    scored = score_rollouts(rows, PROBLEMS, config, executor=FlakyExecutor(failures=1))
    assert [row["excluded"] for row in scored] == [True] + [False] * 19  # 1 of 20: within it


@pytest.mark.docker
def test_an_engine_stopped_mid_batch_scores_no_sample_as_a_failure():
    """Stopped as a service manager stops it (SIGTERM; it kills its containers 15 s later):
    its containers die with it and none can start again, so the batch stops, naming the
    engine, and no verdict of the infrastructure's reaches a reward. The batch takes 24 s."""
    import os
    import signal
    import time

    from docker_engines import second_docker_engine

    from codepost.pipeline.stages.scoring import SandboxSettings, close_pools
    from codepost.sandbox import SandboxUnavailable

    problem = PROBLEMS["HumanEval/0"]
    code = f"import time\ntime.sleep(3)\n{problem.prompt}{problem.canonical_solution}"
    slow = ("HumanEval/0", f"```python\n{code}```", "chat")
    with second_docker_engine() as engine:
        sandbox = SandboxSettings(docker_hosts=[engine], container_memory_mb=1152)
        config = ScoreConfig(workers=2, timeout_s=10.0, sandbox=sandbox)
        dockerd = int((Path(engine.removeprefix("unix://")).parent / "docker.pid").read_text())
        stop = threading.Timer(3.0, os.kill, (dockerd, signal.SIGTERM))
        stop.start()
        started = time.monotonic()
        try:
            with pytest.raises((SandboxUnavailable, SandboxFailing)) as stopped:
                score_rollouts(rows_for([slow] * 16), PROBLEMS, config)
        finally:
            stop.cancel()
            close_pools()
    assert engine.removeprefix("unix://") in str(stopped.value) or "sandbox is failing" in str(
        stopped.value
    ), stopped.value
    assert time.monotonic() - started < 120


@pytest.mark.docker
def test_run_score_in_the_real_sandbox_writes_scored_parquet(tmp_path):
    from datasets import Dataset

    rows = rows_for([reference("HumanEval/0"), ("HumanEval/1", "```python\ndef separate_paren_groups(s):\n    return []\n```", "chat"),
                     ("HumanEval/0", "```python\nwhile True:\n    pass\n```", "chat")])  # fmt: skip
    Dataset.from_list(rows).to_parquet(str(tmp_path / "rollouts.parquet"))
    config = ScoreConfig(timeout_s=2.0, workers=2)
    path = run_score(config, tmp_path / "rollouts.parquet", ProblemSet(limit=2), tmp_path / "out")
    scored = Dataset.from_parquet(str(path)).to_list()
    assert [r["status"] for r in scored] == ["passed", "failed", "timeout"]
    assert [r["reward"] for r in scored] == [1.0, 0.0, 0.0]
    assert summarize(scored)["reward/pass_rate"] == pytest.approx(1 / 3)


def test_a_container_too_small_for_its_program_is_refused():
    from codepost.pipeline.stages.scoring import SandboxSettings

    with pytest.raises(ValueError, match="container_memory_mb=512 leaves no room"):
        ScoreConfig(memory_mb=512, sandbox=SandboxSettings(container_memory_mb=512))


@pytest.mark.docker
def test_the_sandbox_hosts_image_and_container_sizes_come_from_the_config():
    import os

    import docker

    from codepost.pipeline.stages.scoring import SandboxSettings, get_pool
    from codepost.sandbox import DEFAULT_IMAGE

    sandbox = SandboxSettings(
        docker_hosts=["unix:///var/run/docker.sock"],
        image=DEFAULT_IMAGE,
        cpus=0.5,
        container_memory_mb=1024,
    )
    config = ScoreConfig(workers=1, sandbox=sandbox)
    (row,) = score_rollouts(rows_for([reference("HumanEval/0")]), PROBLEMS, config)
    assert row["status"] == "passed"
    pool = get_pool(sandbox.pool_config(1))
    assert pool.config.docker_hosts == ("unix:///var/run/docker.sock",)
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock")
    mine = [c for c in client.containers.list(filters={"label": "codepost.owner"})
            if c.labels["codepost.owner"].endswith(f":{os.getpid()}")]  # fmt: skip
    sizes = {(c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["Memory"]) for c in mine}
    assert (500_000_000, 1024 * 2**20) in sizes


@pytest.mark.docker
def test_scoring_spreads_over_two_docker_engines():
    import os

    import docker
    from docker_engines import second_docker_engine

    from codepost.pipeline.stages.scoring import SandboxSettings, close_pools

    with second_docker_engine() as second:
        hosts = ["unix:///var/run/docker.sock", second]
        # A container size no other pool of this process uses: these are this pool's.
        sandbox = SandboxSettings(docker_hosts=hosts, container_memory_mb=1280)
        config = ScoreConfig(workers=2, timeout_s=5.0, sandbox=sandbox)
        failing = (
            "HumanEval/1",
            "```python\ndef separate_paren_groups(s):\n    return []\n```",
            "chat",
        )
        answers = [reference("HumanEval/0"), failing] * 3
        try:
            scored = score_rollouts(rows_for(answers), PROBLEMS, config)
            per_engine = {
                host: sum(
                    c.labels["codepost.owner"].endswith(f":{os.getpid()}")
                    and c.attrs["HostConfig"]["Memory"] == 1280 * 2**20
                    for c in docker.DockerClient(base_url=host).containers.list(
                        filters={"label": "codepost.owner"}
                    )
                )
                for host in hosts
            }
        finally:
            close_pools()  # before the engine stops
    assert [row["status"] for row in scored] == ["passed", "failed"] * 3
    assert per_engine == {hosts[0]: 1, hosts[1]: 1}, per_engine
