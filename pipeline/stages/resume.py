"""The one resume rule every stage follows: :func:`run_stage` runs a registered stage
(:mod:`.registry`) under it (Prefect's INPUTS + TASK_SOURCE cache policy, on disk): every
output is keyed by the stage's config, the content of every input it reads and its code.

- Inputs: the artifacts handed to it (an input checkpoint verified against its manifest first:
  one edited after it was published is refused, naming the file), and what its config names
  outside itself, wherever in the config (:class:`...settings.walk.OutsideInput`): problem files,
  a local model folder, the sandbox image's id and runner.
- Code: its module and every module of the package that module imports, plug-in packages
  whole (:mod:`..code_version`).
- The output of key K lives in ``<out_root>/<K[:12]>/``; its record ``<K[:12]>.json``, beside
  the folder, is written last and marks it finished.
- A finished output with the same key is reused, after its files are checked against the
  digests recorded (a corrupt or edited output is refused, naming the file).
- Another key is computed into a new folder: nothing is overwritten, and the run says what
  changed (a setting, an input and which of its files, or which file of the code). Config
  fields a stage declares ``extendable`` (RL's ``iterations``) only append work,
  so they are left out of the key: more iterations continue in the same folder.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ...settings.walk import OutsideInput, settings_of
from ...verifiers.plugins import Plugin
from .. import atomic
from ..checkpoints.manifest import MANIFEST, sha256_file, verified, verify
from ..code_version import code_digest
from .registry import Artifacts, Executor, Stage, StaleOutputError

log = logging.getLogger("codepost.stages")


def digest(path: str) -> str:
    """A content digest of an artifact: a published folder by its manifest (which holds every
    file's hash), a file by its bytes, a folder without a manifest by all its files, and
    anything else (a hub id, ``embedded:...``) by its name."""
    target = Path(path)
    if (target / MANIFEST).is_file():
        return sha256_file(target / MANIFEST)
    if target.is_file():
        return sha256_file(target)
    if target.is_dir():
        return _folder_digest(file_digests(target))
    return hashlib.sha256(f"name:{path}".encode()).hexdigest()


def input_digest(path: str) -> str:
    """:func:`digest` of an input, a published folder's once its files match its manifest
    (:class:`..checkpoints.manifest.ManifestMismatch` names the file otherwise): a checkpoint
    whose weights were replaced in place is refused before a stage builds on it."""
    if (Path(path) / MANIFEST).is_file():
        verified(Path(path))
    return digest(path)


def named_inputs(config: BaseModel) -> dict[str, str]:
    """The content of everything ``config`` names outside itself, at any depth: each
    :class:`OutsideInput`'s ``content_digests``, and the module of each user's function named
    by import path (:class:`Plugin`)."""
    named: dict[str, str] = {}
    for setting in settings_of(config, OutsideInput):
        named.update(setting.content_digests())
    for plugin in settings_of(config, Plugin):
        named.update(plugin.source_digest())
    return dict(sorted(named.items()))


def _folder_digest(files: dict[str, str]) -> str:
    payload = json.dumps([list(item) for item in files.items()])
    return hashlib.sha256(payload.encode()).hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` (by its relative path, sorted) -> its sha256."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {str(p.relative_to(folder)): sha256_file(p) for p in files}


def stage_key(stage: Stage, config: BaseModel, inputs: Artifacts) -> tuple[str, dict[str, Any]]:
    """The key of ``stage``'s output for ``config`` and ``inputs``, and what it was made of."""
    keyed = config.model_dump(mode="json", exclude=set(stage.extendable))
    files = stage.code_files()
    parts: dict[str, Any] = {
        "stage": stage.name,
        "config": keyed,
        "inputs": {kind: input_digest(path) for kind, path in sorted(inputs.present().items())},
        "code": code_digest(files),
    }
    named = named_inputs(config)
    if named:  # a config that names nothing outside itself keeps the key it had
        parts["named_inputs"] = named
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return key, {**parts, "code_files": files, "input_paths": inputs.present()}


def run_stage(
    stage: Stage,
    config: BaseModel,
    inputs: Artifacts,
    out_root: Path,
    execute: Executor | None = None,
    label: str | None = None,
    write_record: bool = True,
) -> Artifacts:
    """``stage`` on ``inputs`` under the resume rule; ``execute`` runs it (default: here).
    ``write_record=False`` on the other ranks of a process group: they compute alongside the main
    process, which alone writes the record."""
    out_root = Path(out_root)
    key, parts = stage_key(stage, config, inputs)
    out_dir = out_root / key[:12]
    record_path = out_root / f"{key[:12]}.json"
    full_config = config.model_dump(mode="json")
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record["config"] == full_config:
            outputs = _checked_outputs(record, out_root, record_path)
            log.info("%s: reusing %s (same config, inputs and code)", stage.name, out_dir)
            return outputs
        why = _changes(record, parts, full_config, stage)
        log.info("%s: continuing %s (%s)", stage.name, out_dir, why)
    else:
        why = _why_new(out_root, parts, full_config, stage)
        log.info("%s: computing %s%s", stage.name, out_dir, f" ({why})" if why else "")
    outputs = (execute or execute_here)(stage, config, inputs, out_dir, label or stage.name)
    if not write_record:
        return outputs
    record = {
        "stage": stage.name,
        "key": key,
        "config": full_config,
        "inputs": {
            kind: {"path": path, "digest": parts["inputs"][kind]}
            for kind, path in inputs.present().items()
        },
        "named_inputs": parts.get("named_inputs", {}),
        "outputs": {
            kind: _output_record(path, out_root) for kind, path in outputs.present().items()
        },
        "code": parts["code"],
        "code_files": parts["code_files"],
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    atomic.write_json(record_path, record)
    return outputs


def execute_here(
    stage: Stage, config: Any, inputs: Artifacts, out_dir: Path, label: str
) -> Artifacts:
    return stage.run(config, inputs, out_dir)


def _output_record(path: str, out_root: Path) -> dict[str, Any]:
    """Where an output is and its digest; a folder without a manifest also lists its files'
    digests, so a check names the file that changed."""
    folder = Path(path)
    if folder.is_dir() and not (folder / MANIFEST).is_file():
        files = file_digests(folder)  # each file hashed once, for both
        return {"path": _relative(path, out_root), "digest": _folder_digest(files), "files": files}
    return {"path": _relative(path, out_root), "digest": digest(path)}


def _relative(path: str, root: Path) -> str:
    """Paths under the run folder are recorded relative to it: the folder can move."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(Path(path).resolve())


def _checked_outputs(record: dict[str, Any], out_root: Path, record_path: Path) -> Artifacts:
    """The recorded outputs, each checked against its digest (and a checkpoint's files against
    its manifest) before anything is built on them."""
    outputs = {}
    for kind, output in record["outputs"].items():
        path = out_root / output["path"]  # an absolute recorded path stays as it is
        if not path.exists():
            problems = [f"{path}: missing"]
        elif (path / MANIFEST).is_file() and (problems := verify(path)):
            pass
        elif digest(str(path)) != output["digest"]:
            problems = _changed_files(path, output.get("files")) or [
                f"{path}: differs from the digest recorded when it was made"
            ]
        else:
            problems = []
        if problems:
            folder = record_path.with_suffix("")
            raise StaleOutputError(
                f"{record['stage']}: the finished output in {folder} does not match its record "
                f"({'; '.join(problems[:3])}): it was corrupted or edited. Delete {folder} and "
                f"{record_path} to compute it again."
            )
        outputs[kind] = str(path)
    return Artifacts(**outputs)


def _changed_files(folder: Path, recorded: dict[str, str] | None) -> list[str]:
    """The files of ``folder`` that differ from, or are not in, its recorded file list."""
    if recorded is None:
        return []
    changed = []
    for name, was, now in _differences(recorded, file_digests(folder)):
        what = "missing" if now is None else "added" if was is None else "differs from its digest"
        changed.append(f"{folder / name}: {what}")
    return changed


def _differences(
    before: dict[str, Any], after: dict[str, Any]
) -> list[tuple[str, Any | None, Any | None]]:
    """Each name whose value differs between ``before`` and ``after`` (None where it is not
    there), in name order."""
    return [
        (name, before.get(name), after.get(name))
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]


def _why_new(out_root: Path, parts: dict[str, Any], config: dict[str, Any], stage: Stage) -> str:
    """What differs from the newest finished output in ``out_root``, if there is one."""
    records = sorted(out_root.glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        return ""
    newest = json.loads(records[-1].read_text())
    return f"{_changes(newest, parts, config, stage)} since {records[-1].with_suffix('').name}"


def _changes(
    record: dict[str, Any], parts: dict[str, Any], config: dict[str, Any], stage: Stage
) -> str:
    """``record``'s output against the one keyed by ``parts`` for ``config``, in words."""
    before = _flat({k: v for k, v in record["config"].items() if k not in stage.extendable})
    after = _flat(parts["config"])
    changed = [f"{name}: {was!r} -> {now!r}" for name, was, now in _differences(before, after)]
    inputs = [
        _input_change(kind, record["inputs"].get(kind, {}).get("path"), parts["input_paths"][kind])
        for kind, value in parts["inputs"].items()
        if record["inputs"].get(kind, {}).get("digest") != value
    ]
    named = _named_changes(record.get("named_inputs"), parts.get("named_inputs", {}))
    code = _code_changes(record.get("code_files"), parts["code_files"])
    if record.get("code") != parts["code"] and not code:
        code = ["the stage's code changed"]
    extended = [
        f"{name}: {record['config'].get(name)!r} -> {config.get(name)!r}"
        for name in stage.extendable
        if record["config"].get(name) != config.get(name)
    ]
    reasons = [*_first(changed), *inputs, *named, *code, *extended]
    return "; ".join(reasons) or "nothing recorded differs"


def _first(reasons: list[str], shown: int = 5) -> list[str]:
    return reasons[:shown] + (["..."] if len(reasons) > shown else [])


def _input_change(kind: str, before: str | None, after: str) -> str:
    """An artifact input that differs from a record's, and where it is (and was)."""
    where = after if before in (None, after) else f"{before} -> {after}"
    return f"input {kind} changed ({where})"


def _named_changes(before: dict[str, str] | None, after: dict[str, str]) -> list[str]:
    """Which outside inputs the config names differ from a record's, each by name (none when
    the record kept no list)."""
    if before is None:
        return []
    changes = []
    for name, was, now in _differences(before, after):
        if now is None:
            changes.append(f"{name} no longer read")
        elif was is None:
            changes.append(f"{name} read now")
        else:
            changes.append(f"{name} changed ({_short(was)} -> {_short(now)})")
    return _first(changes)


def _short(digest: str) -> str:
    """A digest or an image id as a log shows it: its first 12 hex digits."""
    return digest.removeprefix("sha256:")[:12]


def _code_changes(before: dict[str, str] | None, after: dict[str, str]) -> list[str]:
    """Which files of the stage's code differ from a record's (none when it kept no list)."""
    if before is None or before == after:
        return []
    shown = ", ".join(_first([name for name, _, _ in _differences(before, after)]))
    return [f"the stage's code changed: {shown}"]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for name, value in data.items():
            flat.update(_flat(value, f"{prefix}{name}."))
        return flat
    return {prefix.rstrip("."): data}
