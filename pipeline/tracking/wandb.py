"""Weights & Biases: the run and one run per stage in one group (the run folder's name and the
run's id), in the project ``WANDB_PROJECT`` (default ``codepost``), files under
``<run>/tracking/wandb/`` (``WANDB_DIR`` wins). ``WANDB_MODE=offline`` keeps everything on disk
(``wandb sync`` uploads it later).

Online, a key (``WANDB_API_KEY``, or ``wandb login``'s line in ``~/.netrc``) and an answer from
``WANDB_BASE_URL`` are checked before the run starts. wandb-core reports a write that failed (a
full disk) only in its own log: :meth:`WandB.log` and :meth:`WandB.finish` read it and raise."""

from __future__ import annotations

import contextlib
import json
import netrc
import os
import shutil
import urllib.parse
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Tracker, TrackerFailed, TrackerUnavailable, check_answers, register

FULL_BYTES = 1 << 16  # free space under which W&B's folder counts as full (a record block)


def _init(**settings: Any) -> Any:
    import wandb

    # create_new: the pipeline run and a stage's run are both open when they share a process
    return wandb.init(reinit="create_new", settings=wandb.Settings(silent=True), **settings)


@register
class WandB(Tracker):
    name = "wandb"

    def __init__(self, run: Any) -> None:
        self.run = run
        self._log_read = 0  # bytes of wandb-core's log read so far

    @classmethod
    def check(cls) -> None:
        if os.environ.get("WANDB_MODE", "online").lower() in ("offline", "dryrun", "disabled"):
            return
        base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        host = urllib.parse.urlparse(base_url).hostname or base_url
        if not (os.environ.get("WANDB_API_KEY") or _netrc_login(host)):
            raise TrackerUnavailable(
                f"WANDB_API_KEY is not set and ~/.netrc has no login for {host} (WANDB_MODE is "
                "online): `wandb login`, or WANDB_MODE=offline to keep the run on disk and "
                "`wandb sync` it later"
            )
        check_answers(base_url, f"WANDB_BASE_URL={base_url} (WANDB_MODE online)")

    @property
    def where(self) -> str:
        return f"W&B folder {self.run.dir.removesuffix('/files')}"

    @classmethod
    def start_run(
        cls, folder: Path, name: str, params: Mapping[str, str]
    ) -> tuple[Tracker, dict[str, Any]]:
        folder = Path(os.environ.get("WANDB_DIR") or folder / "wandb").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        project = os.environ.get("WANDB_PROJECT", "codepost")
        run_id = uuid.uuid4().hex[:8]
        group = f"{name}-{run_id}"  # this run's stages, not an earlier run's of the same folder
        run = _init(
            project=project, id=run_id, name=name, group=group, job_type="run", dir=str(folder),
            config=dict(params),
        )  # fmt: skip
        return cls(run), {"project": project, "group": group, "dir": str(folder)}

    @classmethod
    def start_stage(cls, attach: Mapping[str, Any], stage: str) -> Tracker:
        run = _init(
            project=attach["project"], group=attach["group"], job_type=stage, name=stage,
            dir=attach["dir"],
        )  # fmt: skip
        return cls(run)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)
        self._check_written()

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
        self._check_written()
        free = shutil.disk_usage(self.run.dir).free
        if free < FULL_BYTES:
            raise TrackerFailed(
                f"its disk is full ({free} bytes free): the last records may be lost"
            )

    def _check_written(self) -> None:
        """Raise the first write wandb-core logged as failed since the last look."""
        failed: list[bytes] = []
        with contextlib.suppress(OSError), Path(self.run.settings.log_internal).open("rb") as log:
            log.seek(self._log_read)
            lines = log.read().splitlines()
            self._log_read = log.tell()
            failed = [line for line in lines if b"failed to save record" in line]
        if failed:  # a JSON line: {"time": ..., "level": "ERROR", "msg": "writer: failed ..."}
            message = failed[0].decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError):
                message = json.loads(message)["msg"]
            raise TrackerFailed(message)


def _netrc_login(host: str) -> bool:
    """Whether ``wandb login`` left a key for ``host`` in ``~/.netrc`` (or ``$NETRC``)."""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
