"""Each tracker's own files or store, read back with its own reader: what a test of a tracker
checks, as ``{run: {metric: {step: value}}}`` plus the parameters and artifacts of the run; and
a stage's output as the run side counts its steps."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Series = dict[str, dict[int, float]]


@dataclass
class Logged:
    runs: dict[str, Series] = field(default_factory=dict)  # "run", or a stage's name
    params: dict[str, str] = field(default_factory=dict)
    artifacts: set[str] = field(default_factory=set)


def read_tensorboard(run_dir: Path) -> Logged:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = Logged()
    for folder in sorted((run_dir / "tracking" / "tensorboard").iterdir()):
        events = EventAccumulator(str(folder), size_guidance={"tensors": 0, "images": 0})
        events.Reload()
        tags = events.Tags()
        logged.runs[folder.name] = {
            tag: {e.step: e.value for e in events.Scalars(tag)} for tag in tags["scalars"]
        }
        texts = {t.removesuffix("/text_summary") for t in tags["tensors"]}
        if folder.name == "run":
            logged.artifacts = set(tags["images"]) | (texts - {"config"})
            config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
            rows = [line.split(" | ") for line in config.splitlines()[2:]]
            logged.params = {row[0].removeprefix("| "): row[1].removesuffix(" |") for row in rows}
        else:  # TRL's callback leaves its arguments as text: it wrote here
            logged.artifacts |= {f"{folder.name}:{text}" for text in texts}
    return logged


def tensorboard_points(folder: Path, tag: str) -> list[tuple[int, float]]:
    """Every point of ``tag`` TensorBoard shows for the run in ``folder``, in order (a step
    logged twice is two points)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def read_mlflow(run_dir: Path) -> Logged:
    from mlflow import MlflowClient

    client = MlflowClient(os.environ.get("MLFLOW_TRACKING_URI") or
                          f"sqlite:///{(run_dir / 'tracking' / 'mlflow.db').resolve()}")  # fmt: skip
    experiment = client.get_experiment_by_name("codepost")
    [top] = client.search_runs([experiment.experiment_id], "tags.`mlflow.runName` = 'run'")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{top.info.run_id}'"
    )
    logged = Logged(params=top.data.params)
    logged.artifacts = {a.path for a in client.list_artifacts(top.info.run_id)}
    for name, run in [("run", top), *((c.info.run_name, c) for c in children)]:
        assert run.info.status == "FINISHED", (name, run.info.status)
        logged.runs[name] = {
            key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in run.data.metrics
        }
    return logged


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B transaction log (``run-<id>.wandb``): a 7-byte file header, then
    LevelDB's log format (32 KiB blocks; each chunk: crc32, length, type 1 full / 2 first /
    3 middle / 4 last). wandb 0.31 reads it in Go only."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pending, offset = [], b"", 7
    while offset + 7 <= len(data):
        if 32768 - offset % 32768 < 7:  # a block's tail too short for a header is padding
            offset += 32768 - offset % 32768
            continue
        length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
        if kind == 0 or offset + 7 + length > len(data):  # the end, or a chunk still being written
            break
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    return records


def _finished_wandb_run(path: Path, timeout_s: float = 60.0) -> list[Any]:
    """A finished run's records, once its ``exit`` record is on disk. ``finish()`` returns
    before they are: wandb-core holds the log's last 32 KiB block in memory until it closes the
    run's stream, which ``finish()`` asks for without waiting (at the latest, the service's
    teardown at the exit of the process that started it closes every stream)."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout_s
    while True:
        records = [wandb_internal_pb2.Record.FromString(data) for data in _wandb_records(path)]
        kinds = [record.WhichOneof("record_type") for record in records]
        if "exit" in kinds:
            return records
        assert time.monotonic() < deadline, (f"no exit record after {timeout_s} s", path, kinds)
        time.sleep(0.05)


def read_wandb(run_dir: Path) -> Logged:
    logged = Logged()
    for folder in sorted((run_dir / "tracking" / "wandb" / "wandb").glob("offline-run-*")):
        [records_file] = folder.glob("run-*.wandb")
        name, series, config = None, {}, {}
        for record in _finished_wandb_run(records_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                name = record.run.display_name
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}  # fmt: skip
                step = int(items.pop("_step"))
                for key, value in items.items():
                    if not key.startswith("_") and isinstance(value, int | float):
                        series.setdefault(key, {})[step] = value
        assert name is not None, records_file
        logged.runs[name] = series
        if name == "run":
            logged.params = {k: v for k, v in config.items() if not k.startswith("_")}
            logged.artifacts = {p.name for p in (folder / "files").iterdir()}
    return logged


def read_trackio(project: str) -> Logged:
    from trackio.sqlite_storage import SQLiteStorage

    logged = Logged()
    for run in SQLiteStorage.get_runs(project):
        series: Series = {}
        for row in SQLiteStorage.get_logs(project, run):
            for key, value in row.items():
                if key not in ("step", "timestamp") and isinstance(value, int | float):
                    series.setdefault(key, {})[int(row["step"])] = value
        name = run.rsplit("/", 1)[-1] if "/" in run else "run"
        logged.runs[name] = series
        if name == "run":
            logged.params = {k: v for k, v in (SQLiteStorage.get_run_config(project, run) or {}).items()
                             if not k.startswith("_")}  # fmt: skip
            links = SQLiteStorage.get_run_artifacts(project, run, None)["output"]
            logged.artifacts = {link["name"] for link in links}
    return logged


def read(tracker: str, run_dir: Path) -> Logged:
    if tracker == "trackio":
        return read_trackio(os.environ.get("TRACKIO_PROJECT", "codepost"))
    return {"tensorboard": read_tensorboard, "mlflow": read_mlflow, "wandb": read_wandb}[tracker](
        run_dir
    )


def made_checkpoint(folder: Path, steps: int) -> str:
    """A published folder whose manifest counts ``steps`` updates (no weights: the run side
    reads the manifest alone), as a stage's output."""
    from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish

    publish(
        folder, lambda staging: None, CheckpointManifest(stage="test", version="v", steps=steps)
    )
    return str(folder)


def offline(monkeypatch: Any, tmp_path: Path) -> None:
    """Every tracker on this machine: W&B offline, trackio's store in ``tmp_path`` (a project of
    its own per test), MLflow in the run folder's SQLite store."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("TRACKIO_PROJECT", f"codepost-{tmp_path.name}")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
