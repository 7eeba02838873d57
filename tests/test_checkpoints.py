"""Checkpoints: published atomically with a manifest, never overwritten, verifiable."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from tiny_models import char_tokenizer, tiny_causal_lm
from transformers import AutoModelForCausalLM

from codepost.pipeline.atomic import WriteError
from codepost.pipeline.checkpoints import manifest as checkpoints
from codepost.pipeline.checkpoints.manifest import CheckpointManifest


@pytest.fixture
def tiny():
    tokenizer = char_tokenizer("abc")
    return tiny_causal_lm(len(tokenizer)), tokenizer


def manifest(**overrides) -> CheckpointManifest:
    return CheckpointManifest(stage="test", version="v1", **overrides)


def test_published_model_loads_and_lists_every_file_with_its_hash(tiny, tmp_path):
    model, tokenizer = tiny
    target = tmp_path / "ckpt"
    written = checkpoints.publish_model(
        target, model, tokenizer, manifest(parent="base", data={"problems": "abc"})
    )
    assert checkpoints.is_published(target)
    assert checkpoints.read_manifest(target) == written
    assert "model.safetensors" in written.files and written.code_version and written.created_at
    assert set(written.files) == {p.name for p in target.iterdir()} - {"manifest.json"}
    assert checkpoints.verify(target) == []
    reloaded = AutoModelForCausalLM.from_pretrained(target)
    assert reloaded.state_dict().keys() == model.state_dict().keys()
    assert not list(tmp_path.glob(".ckpt.tmp-*"))  # staging folder gone


def test_a_published_checkpoint_is_never_replaced(tiny, tmp_path):
    model, tokenizer = tiny
    checkpoints.publish_model(tmp_path / "c", model, tokenizer, manifest())
    with pytest.raises(FileExistsError, match="already published"):
        checkpoints.publish_model(tmp_path / "c", model, tokenizer, manifest())


def test_a_crash_while_writing_leaves_nothing_published(tmp_path):
    def write(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoints.publish(tmp_path / "c", write, manifest())
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


def test_verify_names_changed_and_missing_files(tiny, tmp_path):
    model, tokenizer = tiny
    target = tmp_path / "c"
    checkpoints.publish_model(target, model, tokenizer, manifest())
    (target / "config.json").write_text(json.dumps({"tampered": True}))
    (target / "tokenizer.json").unlink()
    assert sorted(checkpoints.verify(target)) == [
        "config.json: sha256 differs from the manifest",
        "tokenizer.json: missing",
    ]


def test_an_input_checkpoint_is_hashed_once_per_process_until_a_file_of_it_changes(
    tmp_path, monkeypatch
):
    """Verified before every stage that reads it, a checkpoint is read in full only once."""
    weights = bytes(range(256)) * 64

    def write(folder):
        (folder / "model.safetensors").write_bytes(weights)
        (folder / "config.json").write_text("{}")

    target = tmp_path / "c"
    checkpoints.publish(target, write, manifest())
    hashed = []
    sha256_file = checkpoints.sha256_file

    def counted(path):
        hashed.append(path.name)
        return sha256_file(path)

    monkeypatch.setattr(checkpoints, "sha256_file", counted)
    first, again = checkpoints.verified(target), checkpoints.verified(target)
    assert first == again == checkpoints.read_manifest(target)
    assert sorted(hashed) == ["config.json", "model.safetensors"]
    (target / "model.safetensors").write_bytes(weights[:-1] + b"\x00\x00")  # one byte longer
    changed = f"{target}/model.safetensors: sha256 differs"
    with pytest.raises(checkpoints.ManifestMismatch, match=changed):
        checkpoints.verified(target)
    assert sorted(hashed) == ["config.json", "model.safetensors", "model.safetensors"]


def test_lora_is_merged_into_the_published_weights_and_training_goes_on(tiny, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny
    peft = get_peft_model(
        model, LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False)
    )
    checkpoints.publish_model(tmp_path / "c", peft, tokenizer, manifest())
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "c")
    assert not any("lora" in name for name in merged.state_dict())
    assert hasattr(peft, "peft_config")  # the training model keeps its adapters
    ids = tokenizer("abc", return_tensors="pt").input_ids
    expected = peft(input_ids=ids).logits
    torch_close = (merged(input_ids=ids).logits - expected).abs().max().item()
    assert torch_close < 1e-5


def test_reading_a_folder_without_manifest_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a published checkpoint"):
        checkpoints.read_manifest(tmp_path)


def test_a_full_disk_names_the_checkpoint_and_publishes_nothing(full_disk):
    """torch's own zip writer reports ENOSPC as "unexpected pos N vs M"; publish names it."""

    def write(folder):
        torch.save(torch.zeros(1 << 19), folder / "optimizer.pt")  # 2 MiB into 1 MiB

    target = full_disk / "rl" / "iteration-0001"
    with pytest.raises(WriteError) as caught:
        checkpoints.publish(target, write, manifest())
    assert caught.value.errno == errno.ENOSPC
    assert f"No space left on device (writing {target}" in str(caught.value)
    assert [p.name for p in full_disk.iterdir()] == ["rl"]
    assert not list((full_disk / "rl").iterdir())
