"""Functions the stage-worker tests run in a worker process (importable there by name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def speak(word: str) -> str:
    """Output from the worker (Python and file-descriptor level) and from a child of it."""
    print(f"worker says {word}")
    subprocess.run(["sh", "-c", f"echo child says {word} >&2"], check=True)
    return word.upper()


def draw_progress(steps: int) -> None:
    """A progress bar as tqdm draws one: a line redrawn with carriage returns, ended last."""
    for step in range(1, steps + 1):
        print(f"\rstep {step}/{steps}", end="", flush=True)
        time.sleep(0.3)
    print()


def log_at_levels() -> None:
    """A warning through logging (as the stages log), an error as vLLM's processes print them,
    and raw output."""
    import logging

    logging.getLogger("codepost.test").warning("careful")
    print("(EngineCore pid=7) ERROR 11-23 22:01:14 [core.py:1] engine failed", flush=True)
    print("Processed prompts: 100%", flush=True)


def fail(message: str) -> None:
    raise ValueError(message)


def spawn_and_wait(pid_file: str) -> None:
    """A long-lived child (as the vLLM engine is), its pid and the worker's written down."""
    child = subprocess.Popen(["sleep", "300"])
    Path(pid_file).write_text(f"{child.pid} {os.getpid()}")
    print("child started", flush=True)
    time.sleep(300)


if __name__ == "__main__":  # a flow run's process that gets SIGKILLed: see test_stage_worker
    from worker_functions import spawn_and_wait as by_module_name  # not __main__.spawn_and_wait

    from codepost.flows.stage_worker import StageWorker

    StageWorker(Path(sys.argv[1])).call(by_module_name, sys.argv[2], forward=print)


def report_progress(steps: int) -> str:
    """A task as the stages report one, and the environment the call ran with."""
    from codepost.pipeline.progress import track

    with track("scoring", steps) as task:
        for _ in range(steps):
            time.sleep(0.3)
            task.advance()
    return os.environ.get("CODEPOST_TRACKING_STAGE", "")
