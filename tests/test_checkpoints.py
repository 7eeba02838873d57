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
    assert set(written.files) == {p.name for p in target.iterdir()} - {"manifest.json", "README.md"}
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


def test_a_published_model_has_a_hub_card_that_its_evaluations_fill_in(tiny, tmp_path):
    """A user of the Hugging Face stack found no model card: now every published model folder
    has one, as huggingface_hub writes it, naming its base and how it was made; an evaluation of
    the checkpoint adds its scores with intervals. The card is outside the manifest's hashes,
    so rewriting it leaves the checkpoint whole and its resume key as it was."""
    from huggingface_hub import ModelCard

    from codepost.pipeline.checkpoints.card import add_evaluation

    model, tokenizer = tiny
    target = tmp_path / "sft"
    config = {"problems": {"source": "mbpp", "split": "train"}, "training": {"max_steps": 4}}
    written = checkpoints.publish_model(target, model, tokenizer, CheckpointManifest(
        stage="sft", version="sft-1", parent="embedded:smollm2-135m-instruct", config=config,
        data={"problems": "abc123"}, steps=4))  # fmt: skip
    assert written.base_model == "embedded:smollm2-135m-instruct"
    assert checkpoints.CARD not in written.files and (target / checkpoints.CARD).is_file()
    card = ModelCard.load(target / checkpoints.CARD)
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.datasets == ["google-research-datasets/mbpp"]
    assert "de-quantised to float32 from the Q4_1 GGUF" in card.text
    assert "Not evaluated yet" in card.text and "max_steps: 4" in card.text
    key = checkpoints.path_digests("model", target)

    evaluation = {
        "checkpoint": str(target), "problems": {"source": "humaneval", "split": "test"},
        "problems_fingerprint": "f1", "num_problems": 164,
        "greedy": {"pass@1": 9 / 164, "pass@1_ci95": [0.0291, 0.101], "samples": 164, "passed": 9},
    }  # fmt: skip
    assert add_evaluation(target, evaluation)
    assert add_evaluation(target, {**evaluation, "greedy": {**evaluation["greedy"], "passed": 10}})
    card = ModelCard.load(target / checkpoints.CARD)
    [result] = card.data.eval_results  # the same problems again: replaced, not added
    assert (result.metric_type, result.dataset_type) == ("pass@1", "openai/openai_humaneval")
    assert result.metric_value == pytest.approx(9 / 164)
    row = "| humaneval (164) | test | greedy | pass@1 | 0.0549 | [0.0291, 0.1010] | 10 / 164 |"
    assert row in card.text
    assert checkpoints.verify(target) == [] and checkpoints.path_digests("model", target) == key
    child = tmp_path / "rl"  # the lineage's base travels down
    checkpoints.publish_model(child, model, tokenizer, manifest(parent=str(target)))
    assert checkpoints.read_manifest(child).base_model == "embedded:smollm2-135m-instruct"
    assert not add_evaluation("org/hub-model", evaluation)  # not a folder: nothing to write


def test_weights_are_published_in_the_dtype_asked_and_tied_ones_stay_tied(tmp_path):
    """Weights trained in float32 are published as asked (bfloat16: half the bytes), the
    model that goes on training untouched; ``base`` follows the lineage's first model."""
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    from codepost.pipeline.training import saved_dtype

    tokenizer = char_tokenizer("abc")
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))  # fmt: skip
    base = tmp_path / "base"
    model.to(torch.bfloat16).save_pretrained(base)  # a base declared in bfloat16, as the hub's
    model.to(torch.float32)
    assert saved_dtype("base", str(base)) == torch.bfloat16
    assert saved_dtype("float16", str(base)) == torch.float16
    config_dtype = model.config.dtype
    checkpoints.publish_model(tmp_path / "c", model, tokenizer, manifest(parent=str(base)),
                              dtype=saved_dtype("base", str(base)))  # fmt: skip
    with safe_open(tmp_path / "c" / "model.safetensors", "pt") as weights:
        names = list(weights.keys())  # a safetensors file: no `in`
        assert {weights.get_tensor(name).dtype for name in names} == {torch.bfloat16}
        assert "lm_head.weight" not in names  # tied to the embeddings: saved once
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "c")
    assert reloaded.dtype == torch.bfloat16
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.float32 and model.config.dtype == config_dtype
    assert saved_dtype("base", str(tmp_path / "c")) == torch.bfloat16  # its base's, by manifest


def test_a_trainer_state_is_hashed_apart_and_can_be_dropped(tmp_path):
    """An RL iteration's optimizer state (twice its weights) is dropped once a newer iteration
    is published: the checkpoint stays whole. While it is there, it is checked."""

    def write(folder):
        (folder / "config.json").write_text("{}")
        (folder / checkpoints.STATE).mkdir()
        for name in ("tensors.safetensors", "scalars.json"):
            (folder / checkpoints.STATE / name).write_text(name)

    target = tmp_path / "iteration-0001"
    written = checkpoints.publish(target, write, manifest())
    state = {f"{checkpoints.STATE}/tensors.safetensors", f"{checkpoints.STATE}/scalars.json"}
    assert set(written.state) == state and set(written.files) == {"config.json"}
    (target / checkpoints.STATE / "scalars.json").write_text("{}")
    assert checkpoints.verify(target) == [f"{checkpoints.STATE}/scalars.json: sha256 differs "
                                          "from the manifest"]  # fmt: skip
    (target / checkpoints.STATE / "scalars.json").unlink()
    assert checkpoints.verify(target) == [f"{checkpoints.STATE}/scalars.json: missing"]
    checkpoints.drop_state(target)
    assert checkpoints.verify(target) == [] and not (target / checkpoints.STATE).exists()
