"""The asynchronous RL loop (``rl.asynchronous``): the ledger that decides which queued groups
each iteration trains on (fast, from headers alone), then the real RL stage on a tiny model
with the transformers engine and the Docker sandbox: at ``max_staleness: 0`` the same rows and
weights as the synchronous loop, bitwise; no trained row older than ``max_staleness``; the
sampler's process killed (-9) mid-iteration, restarted or resumed, and the run unchanged. Last,
the same K = 0 equality with SmolLM2 sampled by vLLM, its scheduling made deterministic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engines import TEST_ENGINE
from safetensors.torch import load_file
from stage_helpers import SIGNAL, save_tiny_model

from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.data.rows import read_table
from codepost.pipeline.inference.episodes import EpisodeConfig
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.rl.asynchronous import (
    QUEUE,
    AsyncConfig,
    Ledger,
    QueuedGroup,
    RoundHeader,
    SamplerFailed,
)
from codepost.pipeline.rl.metric_names import is_declared
from codepost.pipeline.rl.policy_update import UpdateConfig
from codepost.pipeline.stages.rl import METRICS_FILE, RLConfig, iteration_dir, run_rl

# --------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------


def header(number: int, version: int, first_group: int, *queued: str) -> RoundHeader:
    return RoundHeader(
        number=number, policy_version=version, first_group=first_group, queued=queued
    )


def taken(decision) -> list[tuple[int, str]]:
    return [(group.round, group.prompt_id) for group in decision.taken]


def test_at_max_staleness_0_the_ledger_fills_an_iteration_as_the_synchronous_loop():
    """Rounds until the batch is full, the rest of the last round dropped: it could only train
    one version later."""
    ledger = Ledger(per_iteration=2, max_rounds=3, max_staleness=0)
    assert ledger.next_opening() == 1
    ledger.open(header(1, 0, 0, "a"))  # one group of two was informative
    assert ledger.needs_round()
    ledger.open(header(2, 0, 1, "b", "c"))
    assert not ledger.needs_round()
    first = ledger.close()
    assert taken(first) == [(1, "a"), (2, "b")]
    assert first.stale == [QueuedGroup(2, "c", 0)] and first.dequeued == 3
    assert (first.rounds_opened, ledger.next_opening(), ledger.queued) == (2, 2, 3)
    for number in (3, 4, 5):  # no informative group: max_rounds, then the weights stay
        ledger.open(header(number, 1, 3))
    second = ledger.close()
    assert (second.opened, second.taken, second.stale) == ([3, 4, 5], [], [])


def test_a_group_more_than_max_staleness_versions_old_is_dropped_and_never_taken():
    """A sampler that never refreshes (version 0 throughout), at K = 1: iteration 2 trains on
    version 0 (one version old), iteration 3 drops its rounds as too stale, and the sampler
    would be told to wait: iteration 3 is past 0 + 1 + K."""
    ledger = Ledger(per_iteration=1, max_rounds=2, max_staleness=1)
    ledger.open(header(1, 0, 0, "a", "b"))  # b is left over: iteration 2 may train on it
    assert taken(ledger.close()) == [(1, "a")]
    second = ledger.close()  # b fills iteration 2 without a round
    assert (taken(second), second.opened) == ([(1, "b")], [])
    assert ledger.next_opening() == 3  # a sampler at version 0 must wait for version 1
    ledger.open(header(2, 0, 2, "c"))  # but one that did not is caught here
    ledger.open(header(3, 0, 3, "d"))
    third = ledger.close()
    assert third.taken == []
    assert third.stale == [QueuedGroup(2, "c", 0), QueuedGroup(3, "d", 0)]
    assert all(d.iteration - 1 - g.policy_version <= 1 for d in (second, third) for g in d.taken)


def test_groups_left_over_wait_for_the_next_iteration_within_the_staleness_bound():
    ledger = Ledger(per_iteration=2, max_rounds=3, max_staleness=2)
    ledger.open(header(1, 0, 0, "a", "b"))
    ledger.open(header(2, 0, 2, "c", "a"))  # none needed: round 2 was sampled ahead
    first = ledger.close()
    assert taken(first) == [(1, "a"), (1, "b")] and first.stale == []
    second = ledger.close()  # c, and a again: a prompt once per iteration, as in the sync loop
    assert taken(second) == [(2, "c"), (2, "a")] and second.opened == []
    ledger.open(header(3, 0, 4, "d", "e", "f"))
    third = ledger.close()
    assert taken(third) == [(3, "d"), (3, "e")]
    assert third.stale == [QueuedGroup(3, "f", 0)]  # iteration 4 trains on version 2 at least
    repeated = Ledger(per_iteration=2, max_rounds=3, max_staleness=0)
    repeated.open(header(1, 0, 0, "a"))
    repeated.open(header(2, 0, 1, "a", "b"))
    assert taken(decision := repeated.close()) == [(1, "a"), (2, "b")]
    assert decision.repeated == [QueuedGroup(2, "a", 0)]


def test_a_round_out_of_order_is_refused():
    ledger = Ledger(per_iteration=2, max_rounds=3, max_staleness=0)
    with pytest.raises(ValueError, match="expected round 1 starting at group 0"):
        ledger.open(header(2, 0, 0, "a"))
    with pytest.raises(ValueError, match="expected round 1 starting at group 0"):
        ledger.open(header(1, 0, 5, "a"))


def test_staleness_above_0_needs_an_off_policy_correction_and_one_sampler():
    base = {"update": UpdateConfig(learning_rate=1e-2)}
    RLConfig(**base, asynchronous=AsyncConfig(max_staleness=0))
    with pytest.raises(
        ValueError, match=r"max_staleness=2 trains on rows up to 2 .*sampler_is_cap"
    ):
        RLConfig(**base, asynchronous=AsyncConfig(max_staleness=2))
    RLConfig(update=UpdateConfig(sampler_is_cap=2.0), asynchronous=AsyncConfig(max_staleness=2))
    decoupled = UpdateConfig(policy_loss={"name": "decoupled"})
    RLConfig(update=decoupled, asynchronous=AsyncConfig(max_staleness=4))
    with pytest.raises(ValueError, match="the weight would apply twice"):
        UpdateConfig(policy_loss={"name": "decoupled"}, sampler_is_cap=2.0)
    with pytest.raises(ValueError, match="samplers: every_rank needs the synchronous loop"):
        RLConfig(**base, samplers="every_rank", asynchronous=AsyncConfig(max_staleness=0))


# --------------------------------------------------------------------------------------------
# The RL stage, asynchronous
# --------------------------------------------------------------------------------------------


def rl_config(model, asynchronous: AsyncConfig | None = None, **changes) -> RLConfig:
    """Three GRPO iterations of 2 prompts x 3 completions on a tiny random model, dynamic
    sampling on the reward (whose length term varies in most groups, not all): up to 3 rounds
    an iteration, some groups dropped, some rounds with more informative groups than needed."""
    settings = {
        "model": model,
        "problems": ProblemSet(limit=6),
        "prompt_style": "continuation",
        "iterations": 3,
        "prompts_per_iteration": 2,
        "max_sampling_rounds": 3,
        "dynamic_sampling_metric": "reward",
        "sampling": SamplingConfig(num_generations=3, max_tokens=8),
        "engine": EngineConfig(backend="hf"),
        "scoring": SIGNAL,
        "update": UpdateConfig(learning_rate=1e-2, sampler_is_cap=2.0),
        "asynchronous": asynchronous,
        "save_total_limit": None,  # every iteration's weights are compared
    }
    return RLConfig(**{**settings, **changes})


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]


def rows(out: Path) -> list[tuple[str, dict]]:
    """Every rollouts file's rows, by file, each column as written (no column is a time); the
    checkpoint that sampled a row named relative to its run folder."""
    return [
        (path.name, {**row, "sampler_weights": row["sampler_weights"].replace(str(out), "<run>")})
        for path in sorted((out / "rollouts").glob("iteration-*.parquet"))
        for row in read_table(path, ("prompt_id",)).to_pylist()
    ]


def assert_same_run(out: Path, reference: Path, iterations: int = 3) -> None:
    """The same rows (every column) and the same published weights, bit for bit."""
    assert json.dumps(rows(out)) == json.dumps(rows(reference))
    for i in range(1, iterations + 1):
        ours, theirs = (
            load_file(iteration_dir(run, i) / "model.safetensors") for run in (out, reference)
        )
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[name], theirs[name]) for name in ours), i


def written(out: Path, iteration: int) -> list[dict]:
    return [row for name, row in rows(out) if name == f"iteration-{iteration:04d}.parquet"]


def stale_rows(decided: list[dict]) -> int:
    """Rows of an iteration's informative groups (the reward varies) that did not train though
    their prompt did not train either: what only the staleness bound drops."""
    groups: list[list[dict]] = []
    for row in decided:  # a group's rows are together, group_index 0 first
        if row["group_index"] == 0:
            groups.append([])
        groups[-1].append(row)
    trained = {group[0]["prompt_id"] for group in groups if group[0]["trained"]}
    return sum(
        len(group)
        for group in groups
        if len({row["reward"] for row in group}) > 1
        and not group[0]["trained"]
        and group[0]["prompt_id"] not in trained
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def synchronous(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synchronous")
    run_rl(rl_config(tiny_model), out)
    return out


@pytest.mark.docker
def test_at_max_staleness_0_the_asynchronous_loop_trains_the_synchronous_rows_and_weights(
    tiny_model, synchronous, tmp_path
):
    run_rl(rl_config(tiny_model, AsyncConfig(max_staleness=0)), tmp_path)
    assert_same_run(tmp_path, synchronous)
    ours, theirs = metrics(tmp_path), metrics(synchronous)
    assert [r["data/sampling_rounds"] for r in ours] == [r["data/sampling_rounds"] for r in theirs]
    assert max(r["data/sampling_rounds"] for r in ours) > 1  # dynamic sampling went round again
    for iteration, row in enumerate(ours, 1):
        assert row["queue/staleness/0"] == row["data/groups_trained"] * 3
        # informative groups past the batch in its last round: too stale for the next one
        assert row["queue/rows_stale"] == stale_rows(written(tmp_path, iteration))
        assert row["time/trainer_idle_s"] >= 0 and row["time/sampler_idle_s"] >= 0
    assert [key for row in ours for key in row if not is_declared(key)] == []
    assert not list((tmp_path / QUEUE).glob("round-*.json"))  # every round decided and deleted


@pytest.mark.docker
def test_no_row_more_than_max_staleness_versions_old_is_trained(tiny_model, tmp_path):
    """K = 1, with the sampler free to run a version ahead: whatever the timing, every trained
    row is at most one version older than the weights it trains, the histogram counts every
    trained row, and every row decided is written once."""
    run_rl(rl_config(tiny_model, AsyncConfig(max_staleness=1), iterations=4), tmp_path)
    for iteration, row in enumerate(metrics(tmp_path), 1):
        decided = written(tmp_path, iteration)
        trained = [r for r in decided if r["trained"]]
        assert all(iteration - 1 - r["policy_version"] in (0, 1) for r in trained)
        assert row["queue/staleness/0"] + row["queue/staleness/1"] == len(trained)
        assert not any(key.startswith("queue/staleness/") and key[-1] not in "01" for key in row)
        assert row["queue/rows_stale"] == stale_rows(decided)
    identities = [
        (r["prompt_id"], r["policy_version"], tuple(r["completion_ids"])) for _, r in rows(tmp_path)
    ]
    assert len(identities) == len(set(identities))


def rl_in_a_process(config: RLConfig, out: Path) -> subprocess.Popen:
    """The RL stage run in a Python process of its own, with this one's environment and torch
    threads: vLLM's CPU worker samples in the process that holds its engine at that process's
    thread count, and a different count changes logprobs in their last bits (the sampler of an
    asynchronous run takes its trainer's count)."""
    script = (
        "import sys; from pathlib import Path; import torch\n"
        "torch.set_num_threads(int(sys.argv[3]))\n"
        "from codepost.pipeline.stages.rl import RLConfig, run_rl\n"
        "run_rl(RLConfig.model_validate_json(sys.argv[1]), Path(sys.argv[2]))\n"
    )
    threads = str(torch.get_num_threads())
    return subprocess.Popen(
        [sys.executable, "-c", script, config.model_dump_json(), str(out), threads]
    )


def kill_sampler_once(out: Path, when: Callable[[], bool]) -> list[int]:
    """Kill the sampler's process (-9) as soon as ``when()`` holds, from a thread; the pids
    killed are appended to the list returned."""
    killed: list[int] = []

    def kill() -> None:
        while not when():
            time.sleep(0.01)
        pid = int((out / QUEUE / "sampler.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    threading.Thread(target=kill, daemon=True).start()
    return killed


def refreshing_to_1(out: Path) -> Callable[[], bool]:
    """Iteration 1 is published: the sampler is refreshing, or sampling iteration 2's rounds."""
    return lambda: (out / QUEUE / "published.json").is_file()


@pytest.mark.docker
def test_a_sampler_killed_mid_iteration_is_restarted_and_the_run_is_unchanged(
    tiny_model, synchronous, tmp_path
):
    killed = kill_sampler_once(tmp_path, refreshing_to_1(tmp_path))
    run_rl(rl_config(tiny_model, AsyncConfig(max_staleness=0)), tmp_path)
    assert len(killed) == 1
    assert metrics(tmp_path)[-1]["queue/sampler_restarts"] == 1
    assert int((tmp_path / QUEUE / "sampler.pid").read_text()) != killed[0]
    assert_same_run(tmp_path, synchronous)  # no group lost, none sampled twice


@pytest.mark.docker
def test_a_sampler_killed_past_its_restarts_ends_the_run_saying_how_to_resume(
    tiny_model, synchronous, tmp_path
):
    config = rl_config(tiny_model, AsyncConfig(max_staleness=0, sampler_restarts=0))
    killed = kill_sampler_once(tmp_path, refreshing_to_1(tmp_path))
    with pytest.raises(SamplerFailed, match=r"killed by signal 9 .*resume after iteration") as e:
        run_rl(config, tmp_path)
    published = [row["iteration"] for row in metrics(tmp_path)]
    assert killed and published in ([1], [1, 2])  # it died in iteration 2 (or 3)
    assert str(e.value).endswith(f"resume after iteration {published[-1]}")
    run_rl(config, tmp_path)  # the same command again
    assert [r["iteration"] for r in metrics(tmp_path)] == [1, 2, 3]  # no gap, no repeat
    assert_same_run(tmp_path, synchronous)


@pytest.mark.slow
@pytest.mark.docker
def test_a_trainer_killed_mid_iteration_leaves_no_sampler_and_resumes_unchanged(
    tiny_model, synchronous, tmp_path
):
    """The other side: the trainer's process killed (-9) after iteration 1; its sampler ends on
    its own, and the run started again picks up the queue it left."""
    config = rl_config(tiny_model, AsyncConfig(max_staleness=0))
    trainer = rl_in_a_process(config, tmp_path)
    try:
        while not (iteration_dir(tmp_path, 1) / "manifest.json").is_file():
            assert trainer.poll() is None, "the trainer ended before iteration 1"
            time.sleep(0.05)
        sampler = int((tmp_path / QUEUE / "sampler.pid").read_text())
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 300  # it ends after the round it is sampling, if any
    while _alive(sampler):
        assert time.monotonic() < deadline, f"the sampler (pid {sampler}) outlived its trainer"
        time.sleep(0.1)
    run_rl(config, tmp_path)
    assert [r["iteration"] for r in metrics(tmp_path)] == [1, 2, 3]
    assert_same_run(tmp_path, synchronous)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purpose
        return stat.read().split(") ")[1][0] != "Z"


@pytest.mark.slow
@pytest.mark.docker
def test_episodes_go_through_the_queue_whole(tmp_path):
    """Two-turn episodes (the execution-feedback environment in the sandbox), asynchronous at
    K = 0: the synchronous run's rows and weights; each row an episode of both turns."""
    model = save_tiny_model(tmp_path / "tiny")
    config = rl_config(
        model, prompt_style="chat", iterations=2, episodes=EpisodeConfig(max_turns=2)
    )
    run_rl(config, tmp_path / "sync")
    asynchronous = config.model_copy(update={"asynchronous": AsyncConfig(max_staleness=0)})
    run_rl(asynchronous, tmp_path / "async")
    assert_same_run(tmp_path / "async", tmp_path / "sync", iterations=2)
    episodes = [row for _, row in rows(tmp_path / "async")]
    assert episodes and all(row["turns"] == 2 and 0 in row["model_mask"] for row in episodes)


@pytest.mark.slow
@pytest.mark.docker
def test_with_vllm_scheduling_deterministically_k_0_is_the_synchronous_run_bit_for_bit(
    tmp_path, monkeypatch
):
    """vLLM on the CPU repeats its samples only with its engine core in the process that
    samples (VLLM_ENABLE_V1_MULTIPROCESSING=0, vLLM's rule for reproducible offline runs): its
    scheduler then batches the same requests the same way. So set, SmolLM2 sampled by vLLM and
    refreshed in place after each update (the probe checked) gives the same rows and weights
    synchronously, in a process of its own, and at K = 0, its sampler's process inheriting the
    setting."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    config = RLConfig(
        problems=ProblemSet(limit=4),
        iterations=2,
        prompts_per_iteration=2,
        sampling=SamplingConfig(num_generations=4, max_tokens=40),
        engine=TEST_ENGINE,
        scoring=SIGNAL,
        dynamic_sampling_metric="reward",  # SIGNAL's length term: every iteration updates
        update=UpdateConfig(learning_rate=1e-5, micro_batch_size=4),
        save_total_limit=2,  # both iterations' weights compared, one trainer state (1 GB)
    )
    synchronous = rl_in_a_process(config, tmp_path / "sync")
    assert synchronous.wait() == 0
    reference = metrics(tmp_path / "sync")
    assert [r["update/optimizer_steps"] >= 1 for r in reference] == [True, True]
    # The engine's logprobs of the probe equal the trainer's after every in-place refresh, and
    # the next iteration's rollouts were sampled by the updated weights.
    assert all(r["sampler/refresh_probe_diff"] < TEST_ENGINE.probe_tolerance for r in reference)
    assert reference[1]["sampler/logprob_diff/mean"] < 1e-3
    assert {
        (row["sampler"][:5], row["sampler_weights"]) for row in written(tmp_path / "sync", 2)
    } == {("vllm-", "<run>/checkpoints/iteration-0001")}
    asynchronous = config.model_copy(update={"asynchronous": AsyncConfig(max_staleness=0)})
    run_rl(asynchronous, tmp_path / "async")
    assert_same_run(tmp_path / "async", tmp_path / "sync", iterations=2)
