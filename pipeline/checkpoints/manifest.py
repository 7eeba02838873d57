"""Checkpoints: a Hugging Face model folder (safetensors) plus ``manifest.json``, published
atomically.

The folder is written aside (``.<name>.tmp-*``), the manifest goes in last, and one rename
publishes it (prime-rl's ``trainer/ckpt.py``: a step folder, a marker written last). A folder
with a manifest is complete; a crash leaves only a ``.tmp`` folder, never a half checkpoint.
The manifest carries the lineage (stage, parent, base model, config, data fingerprints,
metrics, updates made, code version, time) and a sha256 of every file, so a checkpoint can
be verified later. Two kinds of file are apart from ``files``, so that changing them later
leaves the checkpoint whole: the model card (``README.md``), rewritten when an evaluation of
the checkpoint finishes (every fact in it comes from the manifest or an evaluation record, both
checked), and the trainer state (``trainer_state/``), hashed in ``state`` and dropped from an
RL iteration once a newer one is published (a resume needs the newest only).
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ... import __version__
from ..atomic import staged

if TYPE_CHECKING:
    import torch

MANIFEST = "manifest.json"
CARD = "README.md"  # the model card (card.py): not hashed, rewritten as evaluations finish
STATE = "trainer_state"  # the folder of the state that continues training: hashed in `state`


class CheckpointManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    version: str
    parent: str | None = Field(None, description="the checkpoint this one was trained from")
    base_model: str | None = Field(
        None, description="the model the lineage started from (a hub id, folder or embedded:)"
    )
    config: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, str] = Field(default_factory=dict, description="data set -> fingerprint")
    metrics: dict[str, Any] = Field(default_factory=dict)
    steps: int = Field(
        0,
        ge=0,
        description="updates the stage made to the model: optimizer steps (SFT, DPO), "
        "iterations (RL: so far)",
    )
    code_version: str = ""
    created_at: str = ""
    files: dict[str, str] = Field(default_factory=dict, description="relative path -> sha256")
    state: dict[str, str] = Field(
        default_factory=dict,
        description=f"{STATE}/ files -> sha256: checked while present (dropped from older RL "
        "iterations)",
    )


def code_version() -> str:
    """``git describe`` of the source tree when it is a checkout, else the package version."""
    root = Path(__file__).resolve().parents[2]
    try:
        described = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return f"{__version__}+{described}" if described else __version__


class ManifestMismatch(ValueError):
    """A published folder whose files no longer match its manifest: edited or corrupted after
    it was published."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_cached(path: Path) -> str:
    """:func:`sha256_file`, once per process for a file's path, size, modification time and
    inode: an input checkpoint is verified before every stage that reads it, and hashing 540 MB
    takes about a second. (A rewrite of the same size within one tick of the file system's
    clock keeps all four: within one process it goes unseen.)"""
    stat = path.stat()
    return _sha256_of(path.resolve(), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=4096)
def _sha256_of(path: Path, size: int, mtime_ns: int, inode: int) -> str:
    return sha256_file(path)


def publish(
    target: Path, write: Callable[[Path], None], manifest: CheckpointManifest
) -> CheckpointManifest:
    """Run ``write(folder)`` into a staging folder, add the manifest (with file hashes) last,
    and rename it to ``target``. Refuses to replace a published checkpoint."""
    target = Path(target)
    if (target / MANIFEST).exists():
        raise FileExistsError(f"checkpoint {target} is already published")
    from .card import write_card

    # An unpublished leftover at ``target`` (no manifest) is replaced; a full disk is a
    # WriteError naming ``target``, not torch's "unexpected pos N vs M".
    with staged(target, folder=True) as staging:
        write(staging)
        hashed = {
            name: sha256_file(staging / name)
            for name in sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))
            if (staging / name).is_file() and name != CARD
        }
        manifest = manifest.model_copy(
            update={
                "files": {n: sha for n, sha in hashed.items() if not _is_state(n)},
                "state": {n: sha for n, sha in hashed.items() if _is_state(n)},
                "base_model": manifest.base_model or lineage_base(manifest.parent),
                "code_version": manifest.code_version or code_version(),
                "created_at": manifest.created_at
                or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            }
        )
        if (staging / "config.json").is_file():  # a model folder: a card, as the hub's have
            write_card(staging, manifest)
        (staging / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return manifest


def _is_state(name: str) -> bool:
    return name.startswith(f"{STATE}/")


def lineage_base(parent: str | None) -> str | None:
    """The model a checkpoint trained from ``parent`` descends from: ``parent``'s own base
    when it is a published checkpoint, else ``parent`` itself (a hub id, a folder)."""
    if parent is None:
        return None
    if is_published(Path(parent)):
        manifest = read_manifest(Path(parent))
        return manifest.base_model or lineage_base(manifest.parent)
    return parent


def write_model(
    folder: Path,
    model: Any,
    tokenizer: Any,
    state_dict: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Save a causal LM (LoRA merged into a copy, so training can go on) and its tokenizer as
    a folder that transformers and vLLM load directly; ``state_dict``: its weights gathered
    whole, when the model holds only a shard of them; ``dtype``: the floating-point weights
    cast to it on the way out (None: as they are), the model itself untouched."""
    to_save = model
    if hasattr(model, "merge_and_unload"):  # a peft model
        to_save = copy.deepcopy(model).merge_and_unload()
    config_dtype, cast = to_save.config.dtype, dtype is not None and dtype != to_save.dtype
    if cast:
        weights = to_save.state_dict() if state_dict is None else state_dict
        copies: dict[int, torch.Tensor] = {}  # one per tensor: tied weights stay tied
        for tensor in weights.values():
            if tensor.is_floating_point() and tensor.data_ptr() not in copies:
                copies[tensor.data_ptr()] = tensor.to(dtype)
        state_dict = {n: copies.get(t.data_ptr(), t) for n, t in weights.items()}
    to_save.save_pretrained(folder, state_dict=state_dict, safe_serialization=True)
    if cast:  # transformers writes the parameters' dtype: config.json says the weights'
        to_save.config.dtype = dtype
        to_save.config.save_pretrained(folder)
    to_save.config.dtype = config_dtype
    tokenizer.save_pretrained(folder)


def publish_model(
    target: Path,
    model: Any,
    tokenizer: Any,
    manifest: CheckpointManifest,
    state_dict: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> CheckpointManifest:
    """Publish a model checkpoint (:func:`write_model`) with its manifest."""
    return publish(
        target, lambda folder: write_model(folder, model, tokenizer, state_dict, dtype), manifest
    )


def is_published(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: Path) -> CheckpointManifest:
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{path} is not a published checkpoint (no {MANIFEST})")
    return CheckpointManifest.model_validate(json.loads(manifest.read_text()))


def verify(path: Path, hash_file: Callable[[Path], str] = sha256_file) -> list[str]:
    """Problems found checking a checkpoint against its manifest; empty when it is intact. The
    trainer state is checked while any of it is there: dropped whole, it is no problem."""
    path = Path(path)
    manifest = read_manifest(path)
    state = manifest.state if any((path / name).exists() for name in manifest.state) else {}
    problems = []
    for name, expected in {**manifest.files, **state}.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name}: missing")
        elif hash_file(file) != expected:
            problems.append(f"{name}: sha256 differs from the manifest")
    return problems


def drop_state(path: Path) -> None:
    """Delete a published checkpoint's trainer state (its ``STATE`` folder), keeping the weights:
    what an RL iteration keeps once a newer one is published. Its manifest still lists the
    state's hashes, which say what it was."""
    shutil.rmtree(Path(path) / STATE, ignore_errors=True)


def verified(path: Path) -> CheckpointManifest:
    """``path``'s manifest, once every file it lists matches it (hashes cached:
    :func:`sha256_cached`); :class:`ManifestMismatch` names the files that do not."""
    problems = verify(path, sha256_cached)
    if problems:
        listed = "; ".join(f"{Path(path) / problem}" for problem in problems[:3])
        raise ManifestMismatch(
            f"{path} does not match its manifest ({listed}): it was edited or corrupted after "
            "it was published, and nothing is built on it"
        )
    return read_manifest(path)


def path_digests(label: str, path: Path) -> dict[str, str]:
    """The content of an outside input at ``path``, for a resume key: a file by its bytes
    (``label``), a folder by each of its files but hidden ones (``label/name``), a published
    folder's files by its manifest once they match it (:func:`verified`), the manifest
    included. Hidden files are a download's or a clone's bookkeeping (``hf download``'s
    ``.cache/``, ``.git/``, whose index changes on a ``git status``), not its content. Hashes
    are cached (:func:`sha256_cached`)."""
    if path.is_file():
        return {label: sha256_cached(path)}
    if (path / MANIFEST).is_file():
        files = {**verified(path).files, MANIFEST: sha256_cached(path / MANIFEST)}
    else:
        found = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        files = {str(p.relative_to(path)): sha256_cached(p) for p in found}
    return {f"{label}/{name}": sha for name, sha in sorted(files.items())}
