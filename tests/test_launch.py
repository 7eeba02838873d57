"""The ``accelerate launch`` command a rank-aware stage is started with (no launch here: the
launches are in test_distributed.py and test_run_cli.py), what decides that one is, and how
the driver reads a launch's output."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from codepost.pipeline.launch import (
    DRIVER_ENV,
    LaunchConfig,
    _run,
    launch_command,
    launches,
    main,
)
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.stages import get_stage

ENTRY = ["sft", "--config=c.json", "--out-dir=out"]


def test_on_a_cpu_it_is_ddp_over_gloo_on_a_free_port_with_a_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    command, env = launch_command(LaunchConfig(num_processes=2), ENTRY, on_cpu=True)
    assert env["ACCELERATE_USE_CPU"] == "1"
    assert env[DRIVER_ENV] == str(os.getpid())  # each rank watches this process
    assert {"--multi_gpu", "--main_process_port=0", "--num_processes=2"} <= set(command)
    assert "--num_cpu_threads_per_process=4" in command
    assert command[-5:] == ["-m", "codepost.pipeline.launch", *ENTRY]


def test_on_gpus_it_is_ddp_and_the_threads_the_user_set_are_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    command, env = launch_command(LaunchConfig(num_processes=4), ENTRY, on_cpu=False)
    assert "ACCELERATE_USE_CPU" not in env and not any("config_file" in a for a in command)
    assert {"--multi_gpu", "--num_processes=4", "--num_cpu_threads_per_process=3"} <= set(command)


def test_an_accelerate_config_chooses_the_distributed_setup(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text("distributed_type: FSDP\n")
    command, env = launch_command(
        LaunchConfig(num_processes=8, accelerate_config=str(fsdp)), ENTRY, on_cpu=False
    )
    assert f"--config_file={fsdp}" in command and "--num_processes=8" in command
    assert "--multi_gpu" not in command and "ACCELERATE_USE_CPU" not in env
    with pytest.raises(ValidationError, match="no such file"):
        LaunchConfig(accelerate_config=str(tmp_path / "missing.yaml"))


def test_only_a_rank_aware_stage_asking_for_more_than_one_process_is_launched():
    two = LaunchConfig(num_processes=2)
    assert launches(get_stage("sft"), two) and launches(get_stage("update"), two)
    assert not launches(get_stage("sft"), LaunchConfig())
    assert not launches(get_stage("evaluate"), two) and not launches(get_stage("pairs"), two)


def test_the_launch_settings_come_from_the_run_config():
    config = PostTrainConfig.model_validate({"stages": [], "launch": {"num_processes": 4}})
    assert config.launch == LaunchConfig(num_processes=4)


def test_the_entry_takes_an_out_root_or_an_out_dir_not_both(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--config=c.json", "--out-root=a", "--out-dir=b"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sft", "--config=c.json"])
    assert "one of the arguments --out-root --out-dir is required" in capsys.readouterr().err


@pytest.mark.parametrize("sharded", ["DEEPSPEED", "MEGATRON_LM"])
def test_sharded_training_other_than_fsdp_is_refused_naming_it(sharded, monkeypatch, capsys):
    monkeypatch.setenv(f"ACCELERATE_USE_{sharded}", "true")
    with pytest.raises(SystemExit):
        main(["sft", "--config=c.json", "--out-root=a"])
    assert f"{sharded} is not supported: the stages train with DDP or FSDP2" in " ".join(
        capsys.readouterr().err.split()
    )


def test_output_held_by_a_process_the_launch_left_behind_is_not_waited_for():
    # the launch prints its outputs and exits; a process it started keeps the pipes open
    command = [sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '60']); print('done')"]  # fmt: skip
    started = time.monotonic()
    status, printed, _ = _run(command, dict(os.environ), forward=lambda line: None)
    assert (status, list(printed)) == (0, ["done"])
    assert time.monotonic() - started < 30


def test_a_rank_stops_once_its_driver_is_gone():
    """A SIGKILLed driver cannot kill its launch: each rank watches it and stops."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rank = subprocess.Popen(
        [sys.executable, "-c", WATCHING_RANK, str(driver.pid)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rank.stdout is not None and rank.stdout.readline() == "watching\n"
    time.sleep(2)
    assert rank.poll() is None  # the driver is alive: the rank goes on
    driver.kill()
    driver.wait()
    assert rank.wait(timeout=10) == 1
    assert "the driver (pid" in rank.stdout.read()


WATCHING_RANK = """
import sys, time
from codepost.pipeline.launch import watch_driver
watch_driver(int(sys.argv[1]), interval_s=0.2)
print("watching", flush=True)
time.sleep(600)
"""
