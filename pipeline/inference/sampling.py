"""Group sampling: G completions per prompt as rollout rows, from vLLM or transformers.

One engine per process, not per call: :func:`~.engines.get_sampler` keeps it in a small cache
keyed by the model architecture and the engine settings, and :meth:`VLLMSampler.refresh`
loads new weights into it in place (0.5-1 s here, against 30-85 s for a new engine). A refresh that did
not take fails loudly: the engine's logprobs of a fixed probe sequence must equal the
trainer's for the same weights.

``vllm`` on GPUs and ``vllm-cpu`` here are the same package API; the transformers ``generate``
backend produces the same rows on machines without vLLM.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field

from ...settings.config import Seed
from ..data.prompts import Prompt
from ..data.rows import Completion, Context, rollout_rows
from ..model_config import ModelConfig, load_causal_lm, load_tokenizer, safetensors_only
from ..progress import tqdm_class

if TYPE_CHECKING:  # torch loads with a sampler: the configs here are read without it
    import torch

log = logging.getLogger(__name__)

# A fixed, tokenizer-independent probe: token ids spread over the vocabulary.
PROBE_LENGTH = 48


class WeightSyncError(RuntimeError):
    """The sampler does not serve the weights the trainer has: rollouts would be off-policy."""


class SamplingConfig(BaseModel):
    """How completions are drawn; every rollout row carries these, so the update reads the
    temperature from the rows, not from a second setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_generations: int = Field(8, ge=1, le=512, description="completions per prompt (G)")
    temperature: float = Field(1.0, ge=0, le=2, description="0 = greedy; vLLM takes [0, 2]")
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(384, ge=1, le=32768, description="completion tokens at most")
    stop: list[str] = Field(
        default_factory=list,
        description="stop strings, kept in the completion (EOS always stops; chat prompts also "
        "stop at the closing fence of their answer's code block)",
    )
    seed: Seed = 0


class EngineConfig(BaseModel):
    """The sampling engine and its memory: KV cache size on the CPU, a share of GPU memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["vllm", "hf"] = Field("vllm", description="hf = transformers generate")
    max_model_len: int = Field(2048, ge=64)
    enforce_eager: bool = Field(True, description="skip graph compilation (faster start)")
    cpu_kv_cache_gib: int = Field(
        2, ge=1, description="CPU: KV cache space in whole GiB (vLLM's VLLM_CPU_KVCACHE_SPACE)"
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="CPU: cores vLLM's model worker computes on (one OpenMP thread each); "
        "None: every core on a machine of 2 cores or fewer, else every core but one (vLLM's "
        "rule, a core for its scheduler). On a machine other work keeps busy, 1 thread is "
        "faster than 2: docs/stages.md",
    )
    gpu_memory_utilization: float = Field(
        0.4, gt=0, le=0.95, description="GPU: vLLM's share of each GPU (the rest: training)"
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPU: vLLM's tensor parallel")
    hf_max_sequences: int = Field(
        64, ge=1, description="hf backend: sequences per generate call (KV cache bound)"
    )
    hf_logprob_tokens: int = Field(
        1024,
        ge=1,
        description="hf backend: completion tokens per logprob forward (x vocabulary floats)",
    )
    probe_tolerance: float = Field(
        2e-3, gt=0, description="refresh check: max mean |logprob diff| engine vs trainer"
    )
    seed: Seed = 0
    server_url: str | None = Field(
        None,
        description="sample on a running `codepost sample-server` (its own engine and "
        "settings; it reads the checkpoints, so it needs the run folder at the same path) "
        "instead of starting an engine in this process",
    )


def stop_strings(config: SamplingConfig, prompts: Sequence[Prompt]) -> tuple[str, ...]:
    """What ends these prompts' completions besides EOS: the configured stop strings and each
    prompt's own (a chat answer's closing fence)."""
    return tuple(dict.fromkeys([*config.stop, *(s for p in prompts for s in p.stop)]))


def sample_prompts(
    sampler: Sampler,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    config: SamplingConfig,
    policy_version: int,
) -> list[dict[str, Any]]:
    """Rollout rows of ``config.num_generations`` completions of each prompt, through the
    sampler's one generation path (:meth:`Sampler.complete`)."""
    encoded = [tokenizer.encode(p.model_input, add_special_tokens=False) for p in prompts]
    contexts = [
        Context(ids, stop_strings(config, [p])) for p, ids in zip(prompts, encoded, strict=True)
    ]
    return [
        row
        for prompt, ids, group in zip(
            prompts, encoded, sampler.complete(contexts, config), strict=True
        )
        for row in rollout_rows(
            prompt,
            ids,
            group,
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
            sampler=sampler.name,
            sampler_weights=sampler.weights,
            policy_version=policy_version,
        )
    ]


def check_room(max_tokens: int, engine: EngineConfig, setting: str = "max_tokens") -> None:
    """Refuse a completion budget the engine's context cannot hold next to a prompt: vLLM
    would cut every completion short (or refuse the prompt) inside the stage."""
    if max_tokens >= engine.max_model_len:
        raise ValueError(
            f"{setting}={max_tokens} leaves no room for the prompt within "
            f"engine.max_model_len={engine.max_model_len}: lower {setting} or raise "
            "engine.max_model_len"
        )


class Sampler(Protocol):
    @property
    def name(self) -> str: ...  # the engine, e.g. vllm-0.32.0

    @property
    def weights(self) -> str: ...  # the checkpoint whose weights it serves

    def sample(
        self, prompts: Sequence[Prompt], config: SamplingConfig, *, policy_version: int = 0
    ) -> list[dict[str, Any]]: ...

    def complete(
        self, contexts: Sequence[Context], config: SamplingConfig
    ) -> list[list[Completion]]: ...

    def refresh(self, checkpoint: Path, expected_probe: list[float] | None = None) -> float: ...

    def probe_logprobs(self) -> list[float]: ...


def probe_ids(vocab_size: int) -> list[int]:
    """The probe sequence: deterministic, spread over the vocabulary (not only common tokens)."""
    step = max(1, vocab_size // (PROBE_LENGTH + 1))
    return [(17 + i * step) % vocab_size for i in range(PROBE_LENGTH)]


def trainer_probe_logprobs(model: torch.nn.Module, vocab_size: int) -> list[float]:
    """The trainer's float32 logprobs of each probe token after the first."""
    import torch

    ids = torch.tensor([probe_ids(vocab_size)], device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    model.train(was_training)
    logprobs = logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return logprobs.tolist()


def check_probe(engine: list[float], trainer: list[float], tolerance: float) -> float:
    """Mean |diff| of two probe logprob lists; raises :class:`WeightSyncError` past
    ``tolerance``."""
    if len(engine) != len(trainer):
        raise WeightSyncError(f"probe lengths differ: engine {len(engine)}, trainer {len(trainer)}")
    diff = sum(abs(a - b) for a, b in zip(engine, trainer, strict=True)) / len(engine)
    if not math.isfinite(diff) or diff > tolerance:
        raise WeightSyncError(
            f"weight refresh did not take: the engine's probe logprobs differ from the "
            f"trainer's by {diff:.3g} on average (tolerance {tolerance:g})"
        )
    return diff


# safetensors' names of the floating-point dtypes (the others: integers and bool) -> torch's
FLOAT_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def checkpoint_tensors(folder: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name, shape and dtype of every tensor in a folder's safetensors files, read from the
    files' headers: a refresh checks a checkpoint against the served model before it loads
    anything."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        if not file.is_file():  # a FIFO would block the reader, a device never end
            raise WeightSyncError(f"{file}: not a regular file: nothing was loaded")
        try:
            with safe_open(file, "pt") as opened:
                for name in opened.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                    header = opened.get_slice(name)
                    tensors[name] = (tuple(header.get_shape()), header.get_dtype())
        except (OSError, SafetensorError) as exc:  # a header cut short, or not JSON
            raise WeightSyncError(f"{file}: unreadable ({exc}): nothing was loaded") from None
    return tensors


def start_tensors(checkpoint: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name, shape and dtype of the tensors an engine starts from: a local folder's, or a hub
    id's from its snapshot in the local hub cache (the engine downloaded it as it started), so
    that a refresh is checked either way; none when no safetensors of it are on this machine."""
    folder = Path(checkpoint)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

        try:
            folder = Path(snapshot_download(checkpoint, local_files_only=True))
        except (HFValidationError, LocalEntryNotFoundError):
            return {}
    return checkpoint_tensors(folder)


def check_weights_fit(
    checkpoint: str | Path,
    found: dict[str, tuple[tuple[int, ...], str]],
    served: dict[str, tuple[tuple[int, ...], torch.dtype]],
    optional: frozenset[str] = frozenset({"lm_head.weight"}),  # tied to the embeddings
) -> str | None:
    """Refuse, before any tensor is copied, a checkpoint whose tensors are not the served
    model's (missing, extra, of another shape, or not floating point where the model's are):
    a refresh is all or nothing. Floating-point tensors of another precision are cast to the
    model's on load (a bf16 checkpoint into an fp32 engine): returns what is cast, else None."""
    missing = sorted(set(served) - set(found) - optional)
    unexpected = sorted(set(found) - set(served))
    common = sorted(set(found) & set(served))
    reshaped = [name for name in common if found[name][0] != served[name][0]]
    retyped = [
        name
        for name in common
        if served[name][1].is_floating_point and found[name][1] not in FLOAT_DTYPES
    ]
    if missing or unexpected or reshaped or retyped:
        shapes = [(n, found[n][0], served[n][0]) for n in reshaped[:3]]
        dtypes = [(n, found[n][1], str(served[n][1])) for n in retyped[:3]]
        raise WeightSyncError(
            f"{checkpoint}: weights do not fit the model (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, other shapes {shapes}, not floating point {dtypes}; "
            f"{len(missing)}/{len(unexpected)}/{len(reshaped)}/{len(retyped)} in all): "
            "nothing was loaded"
        )
    served_names = {name: str(served[name][1]).removeprefix("torch.") for name in common}
    cast = sorted(
        {
            f"{found[name][1]} -> {served_names[name]}"
            for name in common
            if FLOAT_DTYPES.get(found[name][1], served_names[name]) != served_names[name]
        }
    )
    return f"{checkpoint}: cast on load, {', '.join(cast)}" if cast else None


# Warnings vLLM's CPU engine prints on every start that follow from the settings here, not from
# a fault: the terminal leaves them to the run's log (``flows/terminal.py``).
EXPECTED_ENGINE_WARNINGS = (
    "Enforce eager set, disabling torch.compile",  # enforce_eager: a faster start
    "Inductor compilation was disabled by user settings",  # the same
    "Triton is not installed. triton-cpu is expected",  # vLLM's CPU wheel has no triton-cpu
    "Triton is installed, but doesn't include CPU backend",  # the same, with torch's triton
    "Model Runner V2 requires Triton",  # so V1, the CPU backend's runner
    "VLLM_CPU_NUM_OF_RESERVED_CPU is less than the minimum requirement",  # reserved_cores
    "libiomp is not found in LD_PRELOAD",  # measured within noise: see preload_tcmalloc
    "is set; leaving Torch threads at",  # OMP_NUM_THREADS from cpu_threads
)


def reserved_cores(cpu_threads: int | None) -> int:
    """The cores vLLM's CPU backend leaves out of its worker's thread binding so that
    ``cpu_threads`` remain. None: vLLM's rule (one core kept for its scheduler process) above 2
    cores; on 2 cores or fewer, none kept, as the scheduler needs about 0.4 of a core and the
    worker on both cores of a quiet 2-core machine generated 1.6x faster than on one."""
    cores = len(os.sched_getaffinity(0))
    default = cores if cores <= 2 else cores - 1
    return max(0, cores - (cpu_threads or default))


def preload_tcmalloc() -> None:
    """Have vLLM's engine processes (spawned, so they read ``LD_PRELOAD`` when they start) use
    tcmalloc, as vLLM's CPU guide asks: its pip wheel does not bundle it, and the system's
    (Debian's libtcmalloc-minimal4, from set-up) is taken where there is one. On a quiet 2-core
    machine it generated 1.17x faster at one thread, 1.04x at two."""
    preloaded = os.environ.get("LD_PRELOAD", "")
    library = ctypes.util.find_library("tcmalloc_minimal")
    if library and "libtcmalloc" not in preloaded:
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [library, preloaded]))


def check_free_memory(kv_cache_gib: int) -> None:
    """vLLM's CPU engine takes its KV cache whole when it starts; short of memory it ends with
    "Engine core initialization failed" and the cause far above: say it first, with the
    setting that lowers it (vLLM's own rule: the KV cache must fit in the available memory)."""
    available = psutil.virtual_memory().available / 2**30
    if available < kv_cache_gib:
        raise MemoryError(
            f"not enough free memory to start vLLM's CPU engine: {available:.1f} GiB available, "
            f"it needs {kv_cache_gib} GiB of KV cache (engine.cpu_kv_cache_gib) and its model; "
            "stop other engines on this machine or lower engine.cpu_kv_cache_gib"
        )


@contextlib.contextmanager
def full_disk_named(low_mib: int = 256) -> Iterator[None]:
    """vLLM's engine writes caches as it starts (its cache root, torch's compile cache under the
    temporary folder, shared memory); on a full disk it ends with "Engine core initialization
    failed" and the cause far above. Name the full folder instead."""
    try:
        yield
    except Exception as exc:
        import vllm.envs

        for folder in (vllm.envs.VLLM_CACHE_ROOT, tempfile.gettempdir(), "/dev/shm"):
            try:
                usage = shutil.disk_usage(folder)
            except OSError:  # not there (yet): nothing written there either
                continue
            free = usage.free
            if free < low_mib << 20 and free < usage.total // 20:  # full, not merely small
                raise OSError(
                    errno.ENOSPC,
                    f"No space left on device for vLLM's engine to start ({folder}: "
                    f"{free >> 20} MiB free; its caches go there): free space or point "
                    "VLLM_CACHE_ROOT / TMPDIR elsewhere",
                ) from exc
        raise


class VLLMSampler:
    """A vLLM engine started once and refreshed in place."""

    def __init__(self, checkpoint: str, model: ModelConfig, engine: EngineConfig) -> None:
        # vLLM loads only for its own backend: seconds of start-up, and absent on some machines
        import torch
        import vllm
        from vllm.platforms import current_platform

        self.engine_config = engine
        self.is_cpu = current_platform.is_cpu()
        if self.is_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.cpu_kv_cache_gib))
            check_free_memory(int(os.environ["VLLM_CPU_KVCACHE_SPACE"]))
            # One model step of a batch on a loaded 2-core machine took over vLLM's 300 s, and
            # vLLM ended the engine (EngineDeadError) in the middle of a learning run.
            os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved_cores(engine.cpu_threads))
            preload_tcmalloc()
            memory: dict[str, Any] = {}
        else:
            memory = {
                "gpu_memory_utilization": engine.gpu_memory_utilization,
                "tensor_parallel_size": engine.tensor_parallel_size,
            }
        self.name = f"vllm-{vllm.__version__}"
        with full_disk_named():
            self.llm = vllm.LLM(
                model=checkpoint,
                dtype=model.dtype,
                # Also what refresh reads: a local folder's weights never come from a pickle.
                load_format="safetensors" if safetensors_only(checkpoint) else "auto",
                seed=engine.seed,
                max_model_len=engine.max_model_len,
                enforce_eager=engine.enforce_eager,
                # Logprobs of the distribution actually sampled from (temperature, top-p applied).
                logprobs_mode="processed_logprobs",
                worker_extension_cls="codepost.pipeline.inference.vllm_worker.WeightRefreshExtension",
                **memory,
            )
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.weights = checkpoint
        # the start folder's tensors, as the engine holds them (floats in the engine's dtype)
        dtype = self.llm.llm_engine.model_config.dtype
        assert isinstance(dtype, torch.dtype)  # vLLM resolves "auto" as the engine starts
        self.served = {
            name: (shape, dtype if file_dtype in FLOAT_DTYPES else torch.int64)
            for name, (shape, file_dtype) in start_tensors(checkpoint).items()
        }

    def sample(
        self, prompts: Sequence[Prompt], config: SamplingConfig, *, policy_version: int = 0
    ) -> list[dict[str, Any]]:
        return sample_prompts(self, self.tokenizer, prompts, config, policy_version)

    def complete(
        self, contexts: Sequence[Context], config: SamplingConfig
    ) -> list[list[Completion]]:
        """``config.num_generations`` completions of each context, in one batch."""
        from vllm import SamplingParams  # vLLM's backend only (loaded when the engine started)
        from vllm.inputs import TokensPrompt

        params = {
            stop: SamplingParams(
                n=config.num_generations,
                temperature=config.temperature,
                top_p=config.top_p,
                max_tokens=config.max_tokens,
                stop=list(stop) or None,
                # The ids run through the stop string: text and ids tell the same completion.
                include_stop_str_in_output=True,
                # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
                # request is split by chunked prefill: on the CPU the engine's seed drives it.
                seed=None if self.is_cpu else config.seed,
                logprobs=0,  # the sampled token's own logprob
            )
            for stop in {context.stop for context in contexts}
        }
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=context.ids) for context in contexts],
            [params[context.stop] for context in contexts],
            use_tqdm=tqdm_class("sampling"),  # as a task: lines in a log, a bar on a terminal
        )
        return [
            [
                Completion(
                    text=completion.text,
                    token_ids=list(completion.token_ids),
                    logprobs=[
                        # a sampled position always has its logprob; vLLM types them optional
                        step[token].logprob  # type: ignore[index]
                        for token, step in zip(
                            completion.token_ids, completion.logprobs or [], strict=True
                        )
                    ],
                    finish_reason="length" if completion.finish_reason == "length" else "stop",
                )
                for completion in output.outputs
            ]
            for output in outputs
        ]

    def failure(self) -> str | None:
        """Why the engine can no longer serve (its core process died), else None."""
        resources = getattr(self.llm.llm_engine.engine_core, "resources", None)  # multiprocess
        if resources is not None and resources.engine_dead:
            return "vLLM's engine core died (EngineDeadError; its log says why): restart it"
        return None

    def probe_logprobs(self) -> list[float]:
        """The engine's logprobs of the probe tokens (prompt logprobs, temperature 1)."""
        from vllm import SamplingParams  # vLLM's backend only (loaded when the engine started)
        from vllm.inputs import TokensPrompt

        ids = probe_ids(self.vocab_size)
        (output,) = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids)],
            SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0),
            use_tqdm=False,
        )
        assert output.prompt_logprobs is not None  # asked for: prompt_logprobs=0
        return [
            step[token].logprob  # type: ignore[index]  # only the first position has none
            for token, step in zip(ids[1:], output.prompt_logprobs[1:], strict=True)
        ]

    def refresh(self, checkpoint: Path, expected_probe: list[float] | None = None) -> float:
        """Serve the weights of ``checkpoint`` in place; with ``expected_probe`` (the trainer's
        :func:`trainer_probe_logprobs`), check they took. Returns the probe's mean |diff|."""
        if not self.served:
            raise WeightSyncError(
                f"{checkpoint}: the engine serves {self.weights}, whose safetensors are not on "
                "this machine, so no refresh can be checked against it: nothing was loaded; "
                "start the engine from a local folder"
            )
        cast = check_weights_fit(checkpoint, checkpoint_tensors(checkpoint), self.served)
        if cast is not None:
            log.warning(cast)
        self.llm.collective_rpc("refresh_weights", args=(str(checkpoint),))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.weights = str(checkpoint)
        if expected_probe is None:
            return math.nan
        return check_probe(
            self.probe_logprobs(), expected_probe, self.engine_config.probe_tolerance
        )


class HFSampler:
    """The transformers ``generate`` backend: the same rows, for machines without vLLM."""

    def __init__(self, checkpoint: str, model: ModelConfig, engine: EngineConfig) -> None:
        from .generate import HF_GENERATE_SAMPLER

        self.name = HF_GENERATE_SAMPLER
        self.model_config = model.model_copy(update={"name_or_path": checkpoint})
        self.model = load_causal_lm(self.model_config)
        self.tokenizer = load_tokenizer(self.model_config)
        self.engine_config = engine
        self.weights = checkpoint

    def sample(
        self, prompts: Sequence[Prompt], config: SamplingConfig, *, policy_version: int = 0
    ) -> list[dict[str, Any]]:
        return sample_prompts(self, self.tokenizer, prompts, config, policy_version)

    def complete(
        self, contexts: Sequence[Context], config: SamplingConfig
    ) -> list[list[Completion]]:
        """``config.num_generations`` completions of each context, a bounded number of
        sequences per ``generate`` call (each holds a KV cache for all of its sequences); one
        call holds contexts of the same stop strings only, since a call stops at all of its."""
        from .generate import generate_completions

        per_call = max(1, self.engine_config.hf_max_sequences // config.num_generations)
        by_stop: dict[tuple[str, ...], list[int]] = {}
        for index, context in enumerate(contexts):
            by_stop.setdefault(context.stop, []).append(index)
        groups: list[list[Completion]] = [[] for _ in contexts]
        for stop, indices in by_stop.items():
            for start in range(0, len(indices), per_call):
                chunk = indices[start : start + per_call]
                made = generate_completions(
                    self.model,
                    self.tokenizer,
                    [contexts[index].ids for index in chunk],
                    num_generations=config.num_generations,
                    max_new_tokens=config.max_tokens,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    stop_strings=stop,
                    seed=config.seed + chunk[0],
                    tokens_per_forward=self.engine_config.hf_logprob_tokens,
                )
                for index, group in zip(chunk, made, strict=True):
                    groups[index] = group
        return groups

    def probe_logprobs(self) -> list[float]:
        return trainer_probe_logprobs(self.model, self.model.config.vocab_size)

    def refresh(self, checkpoint: Path, expected_probe: list[float] | None = None) -> float:
        from safetensors.torch import load_file

        served = {name: (tuple(t.shape), t.dtype) for name, t in self.model.state_dict().items()}
        cast = check_weights_fit(checkpoint, checkpoint_tensors(checkpoint), served)
        if cast is not None:
            log.warning(cast)
        state = {}
        for file in sorted(Path(checkpoint).glob("*.safetensors")):
            state.update(load_file(file))
        self.model.load_state_dict(state, strict=False)  # all of it fits: checked above
        self.weights = str(checkpoint)
        if expected_probe is None:
            return math.nan
        return check_probe(
            self.probe_logprobs(), expected_probe, self.engine_config.probe_tolerance
        )
