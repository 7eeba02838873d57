"""Rank-aware stages on N processes: the ``accelerate launch`` entry, and the driver's side.

The entry runs one registered stage in the current process group::

    accelerate launch --num_processes N -m codepost.pipeline.launch STAGE \\
        --config config.json [--inputs inputs.json] (--out-root D | --out-dir D/<key>)

``config.json`` is the stage's config (its pydantic model as JSON), ``inputs.json`` an
:class:`~.stages.registry.Artifacts` object. With ``--out-root`` the stage runs under the resume
rule of :func:`~.stages.resume.run_stage` into ``D/<key>/``, exactly as ``codepost run`` lays
it out; with ``--out-dir`` it runs into that folder and nothing more, for a driver whose own
``run_stage`` has keyed the folder and writes the record. Every rank runs the stage's code (the
update and SFT share each batch among the ranks); only the main process writes files (the
checkpoint, its manifest, the resume record) while the others wait at a barrier. The main
process prints the outputs as JSON on stdout. Without ``accelerate launch`` it is one process,
as ``codepost run`` would run the stage.

The driver (``codepost run``, the run loop) starts it with :func:`launch_stage` for every
rank-aware stage (``Stage.multi_process``) when :class:`LaunchConfig` asks for more than one
process; every other stage runs in the driver.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .inference.engines import close_samplers
from .output_lines import OutputLines
from .resources import close_all
from .stages import Artifacts, Stage, get_stage, run_stage

if TYPE_CHECKING:  # loaded by a launch, not by the run's config (LaunchConfig)
    from accelerate import Accelerator, PartialState

log = logging.getLogger("codepost.launch")
# accelerate's sharded setups (its launcher sets ACCELERATE_USE_<name>) that the stages are not
# built for; FSDP (version 2) they are
UNSUPPORTED = ("DEEPSPEED", "MEGATRON_LM")
TAIL_LINES = 60  # of the output, in the error when a launch fails (the launcher adds ~45)
LINGER_S = 10.0  # reading a launch's output after it exited, at most
DRIVER_ENV = "CODEPOST_LAUNCH_DRIVER"  # the pid of the process that launched the ranks


class LaunchConfig(BaseModel):
    """How the rank-aware stages of a run are started; not part of any stage's key (the same
    outputs on 1 or N processes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_processes: int = Field(
        1,
        ge=1,
        description="processes for each rank-aware stage (sft, rl, update, dpo), one per GPU, "
        "through `accelerate launch`; the other stages run in the driver",
    )
    accelerate_config: str | None = Field(
        None,
        description="an accelerate config YAML (`accelerate config`), passed as --config_file: "
        "machines, GPUs, DDP settings; default: DDP on this machine (over gloo without CUDA). "
        "FSDP (fsdp_version: 2, e.g. configs/accelerate/fsdp2.yaml) shards them; DeepSpeed and "
        "Megatron-LM are refused",
    )

    @field_validator("accelerate_config")
    @classmethod
    def _a_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_file():
            raise ValueError(f"no such file: {path!r}")
        return path


class LaunchFailed(RuntimeError):
    """A rank of a launched stage failed: the stage, the exit status and the last lines."""


def launches(stage: Stage, launch: LaunchConfig) -> bool:
    """Whether ``stage`` runs on several processes: only a rank-aware one ever does."""
    return launch.num_processes > 1 and stage.multi_process


def launch_command(
    launch: LaunchConfig, entry_args: Sequence[str], on_cpu: bool
) -> tuple[list[str], dict[str, str]]:
    """The ``accelerate launch`` command line of the entry with ``entry_args``, and its
    environment: the user's accelerate config, or DDP on one machine (over gloo ``on_cpu``) on
    a free port; each rank gets its share of the cores unless ``OMP_NUM_THREADS`` is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = os.environ.get("OMP_NUM_THREADS") or max(1, (cores or 1) // launch.num_processes)
    env = {
        **os.environ,
        # this process's import path, as multiprocessing gives its children
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        "PYTHONUNBUFFERED": "1",  # the ranks' lines as they are written
        DRIVER_ENV: str(os.getpid()),
    }
    if launch.accelerate_config is not None:
        distributed = [f"--config_file={launch.accelerate_config}"]
    else:
        distributed = [
            *(["--multi_gpu"] if launch.num_processes > 1 else []),
            "--num_machines=1",
            "--mixed_precision=no",  # the stage's own settings choose (bf16 in TrainingSettings)
            "--dynamo_backend=no",
            "--main_process_port=0",  # a free one: runs side by side do not collide
        ]
    if on_cpu:
        # gloo; said in the environment, as a config file cannot say `use_cpu` with FSDP
        env["ACCELERATE_USE_CPU"] = "1"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *distributed,
        f"--num_processes={launch.num_processes}",
        f"--num_cpu_threads_per_process={threads}",
        "-m",
        __name__,
        *entry_args,
    ]
    return command, env


def launch_stage(
    stage: Stage,
    config: BaseModel,
    inputs: Artifacts,
    out_dir: Path,
    launch: LaunchConfig,
    forward: Callable[[str], None] = log.info,
) -> Artifacts:
    """``stage`` on ``launch.num_processes`` processes into ``out_dir`` (no resume rule: the
    caller's ``run_stage`` keeps it), the ranks' output passed to ``forward`` line by line; the
    outputs the main process printed. A failed rank raises :class:`LaunchFailed`; interrupted
    (cancelled, timed out), the ranks are killed before it re-raises."""
    import torch

    # The ranks load their own model: what this process holds on the accelerator would be
    # memory they lack.
    close_samplers()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix=f"launch-{stage.name}-") as folder:
        config_file, inputs_file = Path(folder, "config.json"), Path(folder, "inputs.json")
        config_file.write_text(config.model_dump_json())
        inputs_file.write_text(inputs.model_dump_json())
        entry_args = [
            stage.name,
            f"--config={config_file}",
            f"--inputs={inputs_file}",
            f"--out-dir={out_dir}",
        ]
        command, env = launch_command(launch, entry_args, on_cpu=not torch.cuda.is_available())
        log.info("%s: launching %d processes", stage.name, launch.num_processes)
        status, printed, tail = _run(command, env, forward)
    if status != 0:
        raise LaunchFailed(
            f"{stage.name} on {launch.num_processes} processes failed (exit status {status}); "
            "its last lines:\n" + "\n".join(tail)
        )
    for line in reversed(printed):
        try:
            return Artifacts.model_validate_json(line)
        except ValidationError:
            continue
    raise LaunchFailed(
        f"{stage.name}: the main process printed no outputs; its last lines:\n" + "\n".join(tail)
    )


def _run(
    command: list[str], env: dict[str, str], forward: Callable[[str], None]
) -> tuple[int, collections.deque[str], collections.deque[str]]:
    """``command``'s exit status, its last stdout lines and its last lines of both, every
    line passed to ``forward`` as it comes; every process under it killed if this is
    interrupted. A process it left behind holding its output is not waited for."""
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        with selectors.DefaultSelector() as selector:
            for pipe in (process.stdout, process.stderr):
                assert pipe is not None
                selector.register(pipe, selectors.EVENT_READ, OutputLines())
            exited_at = None
            while selector.get_map():
                if process.poll() is not None:
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > LINGER_S:
                        log.warning(
                            "the launch exited, but a process it started still holds its "
                            "output: not waiting for it"
                        )
                        break
                for key, _ in selector.select(timeout=1.0):
                    data = os.read(key.fd, 1 << 16)
                    if not data:  # the end: a last line that did not end
                        selector.unregister(key.fileobj)
                        data = b"\n"
                    for line in key.data.feed(data):
                        forward(line)
                        tail.append(line)
                        if key.fileobj is process.stdout:
                            printed.append(line)
        return process.wait(), printed, tail
    except BaseException:
        kill_process_tree(process.pid)
        process.wait()
        raise
    finally:
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it. Not its process group: torchrun starts each
    rank in a session of its own, and a rank left running holds its accelerator's memory."""
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


class LaunchingExecutor(Protocol):
    """An executor (:class:`~.stages.registry.Executor`) told how rank-aware stages start."""

    def __call__(
        self,
        stage: Stage,
        config: Any,
        inputs: Artifacts,
        out_dir: Path,
        label: str,
        launch: LaunchConfig | None = None,
    ) -> Artifacts: ...


def execute_launched(
    stage: Stage,
    config: Any,
    inputs: Artifacts,
    out_dir: Path,
    label: str,
    launch: LaunchConfig | None = None,
) -> Artifacts:
    """The run loop's executor without Prefect: a rank-aware stage on ``launch``'s processes,
    any other here."""
    if launch is not None and launches(stage, launch):
        return launch_stage(stage, config, inputs, out_dir, launch)
    return stage.run(config, inputs, out_dir)


def main(argv: Sequence[str] | None = None) -> None:
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    parser = argparse.ArgumentParser(
        prog="python -m codepost.pipeline.launch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("stage", help="a registered stage (e.g. sft, rl, update, dpo)")
    parser.add_argument("--config", type=Path, required=True, help="the stage's config as JSON")
    parser.add_argument("--inputs", type=Path, help="an Artifacts object as JSON (default: none)")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--out-root", type=Path, help="the stage's output root (the resume rule)")
    out.add_argument(
        "--out-dir", type=Path, help="the output folder, no resume rule (the caller's record)"
    )
    args = parser.parse_args(argv)
    if DRIVER_ENV in os.environ:
        watch_driver(int(os.environ[DRIVER_ENV]))

    stage = get_stage(args.stage)
    unsupported = [name for name in UNSUPPORTED if parse_flag_from_env(f"ACCELERATE_USE_{name}")]
    if unsupported:
        parser.error(
            f"{unsupported[0]} is not supported: the stages train with DDP or FSDP2 (an "
            "accelerate config with distributed_type MULTI_GPU, or FSDP and fsdp_version: 2)"
        )
    # `accelerate launch --cpu` says so in the environment, which only the Accelerator reads: the
    # shared state made here first would otherwise be one process per rank.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    if state.num_processes > 1 and not stage.multi_process:
        parser.error(f"stage {stage.name!r} runs in one process only (not rank-aware)")
    logging.basicConfig(
        level=logging.INFO if state.is_main_process else logging.WARNING,
        format=f"%(levelname)s [rank {state.process_index}] %(name)s: %(message)s",
    )
    log.info("%s on %d process(es)", stage.name, state.num_processes)
    config = stage.config.model_validate_json(args.config.read_text())
    inputs = Artifacts.model_validate_json(args.inputs.read_text()) if args.inputs else Artifacts()
    if args.out_dir is not None:
        outputs = stage.run(config, inputs, args.out_dir)
    else:
        outputs = run_stage(
            stage, config, inputs, args.out_root, write_record=state.is_main_process
        )
    if state.is_main_process:
        print(outputs.model_dump_json())
    leave_process_group(state)  # the outputs (and the record) are written before any rank exits


def watch_driver(pid: int, interval_s: float = 1.0) -> None:
    """End this rank once the process that launched it is gone. A driver that was SIGKILLed
    cannot kill its launch, and its ranks would train on for nobody, holding their GPUs."""
    try:
        driver = psutil.Process(pid)
    except psutil.NoSuchProcess:
        driver = None

    def watch() -> None:
        # is_running() also compares the start time: a new process with the pid is not it
        while driver is not None and driver.is_running() and driver.status() != "zombie":
            time.sleep(interval_s)
        print(f"codepost.launch: the driver (pid {pid}) is gone; this rank stops", flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="codepost-driver-watch", daemon=True).start()


def leave_process_group(state: PartialState | Accelerator) -> None:
    """End a rank that has finished: past a barrier, then out without interpreter teardown. An
    interpreter exiting with gloo's threads alive sometimes aborts ("terminate called without
    an active exception", ~1 launch in 30 on a loaded machine), failing a finished stage."""
    state.wait_for_everyone()
    if state.num_processes > 1:
        close_all()  # the engine's own processes (vLLM's) and sandbox containers: not orphaned
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
