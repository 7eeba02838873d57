"""Other trainers' sandbox clients, unchanged, against a real 2-worker ``verify-server``: each at
its own default concurrency and deadline, every correct program scores as correct and every
wrong one as wrong, with no request left to run out of time (``peer_clients`` runs them).
OpenEnv's client drives ``codepost env-server`` in tests/test_env_server.py. Then the queue in
front of the pool, fast, over a fake executor."""

from __future__ import annotations

import string
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
import servers
from peer_clients import (
    CORRECT,
    WRONG,
    sandbox_fusion_workload,
    tinker_workload,
    trl_verify_reward,
    verl_workload,
)
from servers import Server
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.sandbox import ExecStatus, ExecutionResult, Job
from codepost.verifiers import load_problems, user_message
from codepost.verifiers.server.admission import VERL, JobQueue, known_caller


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with servers.running_server(
        "verify-server", tmp_path_factory.mktemp("peers"), "--workers", "2"
    ) as running:
        yield running


def refused_for_time(server: Server) -> float:
    """The 504s the server has answered so far (from /metrics)."""
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith('codepost_requests_total{code="504",endpoint="/run_code"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.docker
@pytest.mark.slow
def test_verl_scores_every_case_though_the_queue_outlasts_its_deadline(server):
    """48 cases of 1.5 s on 2 containers are 36 s of work, past verl's 30 s per request: the
    cases that cannot start in time are answered 504, which verl retries, and keep their
    place. Before, 10 of them ran out of time and scored as failed (api_error)."""
    tally = verl_workload(server.url, [CORRECT, CORRECT, WRONG], cases=16)
    assert tally == Counter(correct=32, wrong=16)
    assert refused_for_time(server) > 0  # the queue did outlast the deadline


@pytest.mark.docker
@pytest.mark.slow
def test_sandbox_fusion_client_scores_every_case(server):
    tally = sandbox_fusion_workload(server.url, [CORRECT, WRONG], cases=10)
    assert tally == Counter(correct=10, wrong=10)


@pytest.mark.docker
@pytest.mark.slow
def test_tinker_cookbook_client_scores_every_program(server):
    tally = tinker_workload(server.url, [CORRECT, WRONG, CORRECT, WRONG, CORRECT], cases=2)
    assert tally == Counter(correct=3, wrong=2)


@pytest.mark.docker
@pytest.mark.slow
def test_trl_recipe_rewards_a_grpo_trainers_completions_through_verify(server, tmp_path):
    """The TRL recipe as the docs give it, public API only: prompts from ``user_message``, the
    reward from ``/verify``, in a real ``GRPOTrainer`` step (a tiny random model, so its
    completions fail); and the same function scores MBPP's own solution 1 and a wrong one 0."""
    # here, not at the top: their imports (trl's takes vLLM's) are a minute on 2 busy cores
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    problems = load_problems("mbpp")
    reward = trl_verify_reward(server.url)
    right = f"```python\n{problems['2'].canonical_solution}\n```"
    wrong = "```python\ndef similar_elements(a, b):\n    return ()\n```"
    as_chat = [[{"role": "assistant", "content": answer}] for answer in (right, wrong)]
    assert reward(as_chat, task_id=["2", "2"]) == [1.0, 0.0]

    tokenizer = char_tokenizer(string.printable)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    train = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": user_message(problems[t])}], "task_id": t}
            for t in ("2", "3")
        ]
    )
    rewards: list[float] = []

    def recorded(**kwargs: Any) -> list[float]:
        rewards.extend(reward(**kwargs))
        return rewards[-len(kwargs["completions"]) :]

    recorded.__name__ = "test_reward"
    trainer = GRPOTrainer(
        model=tiny_causal_lm(len(tokenizer)),
        reward_funcs=[recorded],
        train_dataset=train,
        processing_class=tokenizer,
        args=GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=8,
            max_steps=1,
            use_cpu=True,
            bf16=False,
            report_to="none",
        ),
    )
    trainer.train()
    assert rewards == [0.0] * 2  # one step: 2 completions, each scored (and failed) by /verify


# -- the queue in front of the pool, over a fake executor


class HeldExecutor:
    """A pool whose jobs end when the test says so."""

    def __init__(self) -> None:
        self.started: list[tuple[Job, Future[ExecutionResult]]] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        future: Future[ExecutionResult] = Future()
        self.started.append((job, future))
        return future

    def finish(self, index: int) -> None:
        self.started[index][1].set_result(ExecutionResult(ExecStatus.COMPLETED))


def job(name: str) -> Job:
    return Job(program=f"print({name!r})", stdin_cases=("",))


def started_programs(pool: HeldExecutor) -> list[str]:
    return [started.program for started, _ in pool.started]


def test_the_queue_hands_the_pool_one_job_per_container_in_order_of_first_arrival():
    pool = HeldExecutor()
    jobs = JobQueue(pool, workers=2)
    first, second, late = jobs.submit(job("a")), jobs.submit(job("b")), jobs.submit(job("c"))
    retried = jobs.submit(job("retried"), order=time.monotonic() - 60)  # a place from before
    assert started_programs(pool) == ["print('a')", "print('b')"]
    assert late.cancel()  # withdrawn unstarted: the pool never sees it
    pool.finish(0)
    assert first.result().status is ExecStatus.COMPLETED and not second.done()
    assert started_programs(pool)[2:] == ["print('retried')"]
    assert retried.running() and jobs.waiting_count() == 0


def test_the_next_jobs_time_is_the_longest_recent_one_within_its_own_limit():
    pool = HeldExecutor()
    jobs = JobQueue(pool, workers=1)
    assert jobs.expected_s(bound_s=10) == 10  # nothing ran yet: its own limit
    jobs.submit(job("a"))
    time.sleep(0.05)
    pool.finish(0)
    assert 0.05 <= jobs.expected_s(bound_s=10) < 10
    assert jobs.expected_s(bound_s=0.01) == 0.01


def test_the_queues_wait_is_the_jobs_ahead_run_workers_at_a_time_at_the_recent_jobs_mean():
    pool = HeldExecutor()
    jobs = JobQueue(pool, workers=2)
    assert jobs.wait_s() == 0  # a container is free
    for name in "abcdef":
        jobs.submit(job(name))
    pool.finish(0)
    pool.finish(1)  # c and d run now; e and f wait
    mean = sum(jobs.recent) / len(jobs.recent)
    assert jobs.waiting_count() == 2
    assert jobs.wait_s() == pytest.approx(2 * mean)  # e, f, then the new one: 2 rounds of 2


def test_verl_is_known_by_its_headers_and_the_others_are_not():
    verl = {"user-agent": "python-requests/2.34.2", "accept": "application/json"}
    assert known_caller(verl) is VERL
    assert (  # the sandbox-fusion package: requests' own Accept, no deadline
        known_caller({"user-agent": "python-requests/2.34.2", "accept": "*/*"}) is None
    )
    assert known_caller({"user-agent": "Python/3.11 aiohttp/3.14.5"}) is None  # tinker
