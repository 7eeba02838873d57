"""The checkpoint catalog and ``codepost checkpoints``: list, show, verify, tag, prune."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from codepost.flows.cli import main
from codepost.pipeline.checkpoints import catalog
from codepost.pipeline.checkpoints.manifest import CheckpointManifest, publish


def publish_fake(root, name: str, stage: str, created: str) -> None:
    def write(folder):
        (folder / "model.safetensors").write_bytes(name.encode())

    manifest = CheckpointManifest(stage=stage, version=name, created_at=created)
    publish(root / stage / name, write, manifest)


@pytest.fixture
def run(tmp_path):
    for i in range(4):
        publish_fake(tmp_path, f"iteration-{i}", "rl-grpo", f"2026-01-0{i + 1}")
    publish_fake(tmp_path, "final", "sft", "2025-12-31")
    (tmp_path / "rl-grpo" / ".iteration-9.tmp-x").mkdir()  # an unpublished staging folder
    return tmp_path


def test_list_is_every_published_version_oldest_first(run):
    names = [e.name for e in catalog.list_checkpoints(run)]
    assert names == ["sft/final"] + [f"rl-grpo/iteration-{i}" for i in range(4)]


def test_only_model_folders_without_a_manifest_are_listed_unpublished(run):
    """A successful run listed a red "unpublished" row: its RL stage's own config.json."""
    (run / "rl" / "5d754ecf907e").mkdir(parents=True)
    (run / "rl" / "5d754ecf907e" / "config.json").write_text(json.dumps({"iterations": 3}))
    (run / "half").mkdir()  # a model folder whose publishing never finished
    (run / "half" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    listed = catalog.list_checkpoints(run, unpublished=True)
    assert [e.folder for e in listed if not e.published] == ["half"]


def test_tags_resolve_move_and_survive_pruning(run):
    catalog.tag(run, "rl-grpo/iteration-0", "best")
    catalog.tag(run, "sft/final", "production")
    assert catalog.resolve(run, "best").name == "rl-grpo/iteration-0"
    catalog.tag(run, "rl-grpo/iteration-1", "best")  # moves
    assert catalog.resolve(run, "best").tags == ("best",)
    deleted = catalog.prune(run, keep_last=2)
    assert [e.name for e in deleted] == ["rl-grpo/iteration-0"]
    remaining = [e.name for e in catalog.list_checkpoints(run)]
    assert remaining == [
        "sft/final",
        "rl-grpo/iteration-1",
        "rl-grpo/iteration-2",
        "rl-grpo/iteration-3",
    ]
    assert (run / "rl-grpo" / ".iteration-9.tmp-x").is_dir()  # not a checkpoint: untouched


def test_an_unknown_reference_lists_what_exists(run):
    with pytest.raises(LookupError, match="sft/final"):
        catalog.resolve(run, "nope")


def test_the_command_verifies_and_reports_tampering(run, capsys):
    assert main(["checkpoints", "--root", str(run), "verify", "sft/final"]) == 0
    capsys.readouterr()
    assert main(["checkpoints", "--root", str(run), "verify"]) == 0  # every version
    assert capsys.readouterr().out.count("files match") == 5
    (run / "sft" / "final" / "model.safetensors").write_bytes(b"changed")
    assert main(["checkpoints", "--root", str(run), "verify", "sft/final"]) == 1
    assert "sha256 differs" in capsys.readouterr().err
    assert main(["checkpoints", "--root", str(run), "verify"]) == 1
    assert capsys.readouterr().out.count("files match") == 4
    assert main(["checkpoints", "--root", str(run), "tag", "sft/final", "prod"]) == 0
    assert main(["checkpoints", "--root", str(run), "prune", "--keep-last", "0", "--dry-run"]) == 0
    assert "would delete 4" in capsys.readouterr().out
    assert main(["checkpoints", "--root", str(run), "show", "missing"]) == 2


def test_the_command_lists_whole_version_names_when_piped(tmp_path, capsys):
    publish_fake(tmp_path, "iteration-0001", "rl-grpo-with-a-long-stage-name", "2026-01-01")
    assert main(["checkpoints", "--root", str(tmp_path), "list"]) == 0
    assert "rl-grpo-with-a-long-stage-name/iteration-0001" in capsys.readouterr().out


@pytest.mark.parametrize(
    "action", [["list"], ["verify"], ["show", "best"], ["prune", "--keep-last", "1"]]
)
def test_the_command_refuses_a_root_that_is_not_a_folder(tmp_path, capsys, action):
    for root in (tmp_path / "nowhere", tmp_path / "file"):
        (tmp_path / "file").write_text("")
        assert main(["checkpoints", "--root", str(root), *action]) == 2
        assert str(root) in "".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_command_names_a_full_disk_and_leaves_the_tags_as_they_were(full_disk, capsys):
    publish_fake(full_disk, "final", "sft", "2026-01-01")
    with contextlib.suppress(OSError), (full_disk / "filler").open("wb") as filler:
        filler.write(os.urandom(2 << 20))  # the rest of the 1 MiB
    assert main(["checkpoints", "--root", str(full_disk), "tag", "sft/final", "best"]) == 1
    err = "".join(capsys.readouterr().err.split())  # rich folds long lines
    assert f"Nospaceleftondevice(writing{full_disk / 'tags.json'})" in err, err
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "sft"]


@pytest.fixture
def damaged(tmp_path):
    """The red team's case: a healthy SFT checkpoint, then one RL iteration that lost its
    weights file and a newer one that lost its manifest."""
    publish_fake(tmp_path, "final", "sft", "2026-01-01")
    publish_fake(tmp_path, "iteration-0001", "rl", "2026-01-02")
    publish_fake(tmp_path, "iteration-0002", "rl", "2026-01-03")
    (tmp_path / "rl" / "iteration-0001" / "model.safetensors").unlink()
    (tmp_path / "rl" / "iteration-0002" / "manifest.json").unlink()
    return tmp_path


def test_broken_checkpoints_are_listed_as_such_and_never_tagged(damaged, capsys):
    assert main(["checkpoints", "--root", str(damaged), "list"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert "ok" in rows["sft/final"]
    assert "broken: model.safetensors missing" in rows["rl/iteration-0001"]
    assert "unpublished (no manifest.json)" in rows["rl/iteration-0002"]
    assert main(["checkpoints", "--root", str(damaged), "tag", "rl/iteration-0001", "best"]) == 2
    assert "model.safetensors missing" in capsys.readouterr().err
    assert not (damaged / catalog.TAGS_FILE).exists()
    assert main(["checkpoints", "--root", str(damaged), "verify", "rl/iteration-0001"]) == 1


def test_pruning_keeps_the_newest_healthy_checkpoint_not_a_broken_one(damaged, capsys):
    assert main(["checkpoints", "--root", str(damaged), "prune", "--keep-last", "1"]) == 0
    assert "deleted 1: rl/iteration-0001 (broken: model.safetensors missing)" in " ".join(
        capsys.readouterr().out.split()
    )
    assert [e.name for e in catalog.list_checkpoints(damaged)] == ["sft/final"]
    assert (damaged / "rl" / "iteration-0002" / "model.safetensors").is_file()  # not ours to delete
