"""A sampling engine of its own: ``codepost sample-server``, which the stages use through
:class:`~.remote.RemoteSampler` when ``EngineConfig.server_url`` names it.

For a sampler on GPUs of its own, as TRL's ``trl vllm-serve`` and prime-rl's inference server:
training keeps its GPUs, and the engine is started once for a whole run. The weights travel
through the filesystem, as in prime-rl: the trainer publishes a checkpoint, then asks the server
to refresh from that folder, so the server must see the run folder at the same path (one
machine, or a shared filesystem). The refresh is checked with the trainer's probe, as for an
engine in the trainer's process. One request runs at a time: an engine runs one batch at once
anyway, and so a refresh never lands in the middle of a batch.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException
from pydantic import ConfigDict, Field

from ...settings.command_line import EXIT_BAD_INPUT, server_command
from ...verifiers.serving import (
    BearerToken,
    BodyBudget,
    Guard,
    HeldBodies,
    HTTPLimits,
    JSONAnswer,
    answer_errors_plainly,
    http_server,
)
from ..data.prompts import Prompt
from ..data.rows import Context
from ..model_config import ModelConfig, ModelNotFoundError
from .engines import close_samplers, get_sampler
from .remote import MAX_PROMPTS, TOKEN_ENV, CompleteRequest, RefreshRequest, SampleRequest
from .sampling import EngineConfig, SamplingConfig, WeightSyncError

T = TypeVar("T")


class SampleServerConfig(HTTPLimits):
    """What ``codepost sample-server`` serves, where, and what it accepts."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig, description="the weights at start")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    host: str = Field("127.0.0.1", description="interface to bind (0.0.0.0: every one)")
    port: int = Field(8020, ge=1, le=65535)
    token: BearerToken = Field(
        None, description=f"bearer token the clients must send (default: ${TOKEN_ENV}, else none)"
    )
    checkpoint_root: Path | None = Field(
        None,
        description="the folder /refresh may load checkpoints from (the runs' folder, seen at "
        "the same path as the trainer sees it); none: every /refresh is refused",
    )
    max_prompts: int = Field(
        4096, ge=1, le=MAX_PROMPTS, description="prompts in one /sample request"
    )
    max_completions: int = Field(
        65536, ge=1, description="completions in one /sample request (prompts x num_generations)"
    )
    max_pending_bytes: int = Field(
        32 << 20,
        ge=1024,
        description="request bodies held at once (being read, waiting for the engine or "
        "sampled; a body costs up to about 20 times its size once read): past it, 503 with "
        "Retry-After at once. At least max_body_bytes",
    )
    max_stop_strings: int = Field(16, ge=0, description="stop strings in one /sample request")
    max_stop_chars: int = Field(128, ge=1, description="characters in one stop string")


def create_app(config: SampleServerConfig, sampler: Any) -> FastAPI:
    """The server's app over a started ``sampler`` (a :class:`~.sampling.Sampler`)."""
    lock = threading.Lock()  # FastAPI runs these handlers in a thread pool
    unknown_weights: list[str] = []  # why the served weights are neither the old nor the new

    def failure() -> str | None:
        """Why the engine can no longer serve: it died, or a refresh broke off mid-load."""
        died = getattr(sampler, "failure", lambda: None)()
        return died or (unknown_weights[0] if unknown_weights else None)

    def served(call: Callable[[], T]) -> T:
        """``call`` on the engine: a request the engine refuses (vLLM's validation) is the
        caller's 400, an engine that cannot serve a 503."""
        why = failure()
        if why is not None:
            raise HTTPException(503, f"the engine can no longer serve: {why}")
        try:
            return call()
        except request_errors() as exc:
            raise HTTPException(400, f"the engine refused the request: {exc}") from None
        except Exception as exc:
            why = failure()
            if why is not None:
                raise HTTPException(503, f"the engine can no longer serve: {why}") from exc
            raise

    app = FastAPI(title="codepost sample-server", default_response_class=JSONAnswer)
    # The last added runs first: the token and body limits, then the bodies held. A body that
    # does not fit is refused, not kept waiting: the engine answers one request at a time, so
    # it would wait for whole batches (minutes) with its connection open.
    budget = BodyBudget(config.max_pending_bytes, config.retry_after_s, 503)
    app.add_middleware(HeldBodies, budget=budget)
    app.add_middleware(Guard, limits=config)
    answer_errors_plainly(app)

    @app.get("/health")  # open, for load balancers and start-up checks: it says nothing more
    def health() -> JSONAnswer:  # (why it is unhealthy: in the guarded endpoints' 503s)
        if failure() is not None:
            return JSONAnswer({"status": "unhealthy"}, status_code=503)
        return JSONAnswer({"status": "ok"})

    @app.get("/engine")
    def engine() -> dict[str, Any]:
        return {"sampler": sampler.name, "weights": sampler.weights}

    @app.post("/sample")
    def sample(request: SampleRequest) -> dict[str, Any]:
        check_sample_request(request, config)
        try:
            prompts = [Prompt(**prompt) for prompt in request.prompts]  # type: ignore[arg-type]
        except TypeError as exc:
            raise HTTPException(422, f"prompts: {exc}") from exc
        check_prompt_lengths(prompts, sampler.tokenizer, config.engine.max_model_len)
        with lock:
            rows = served(
                lambda: sampler.sample(
                    prompts, request.sampling, policy_version=request.policy_version
                )
            )
        return {"rows": rows}

    @app.post("/complete")
    def complete(request: CompleteRequest) -> dict[str, Any]:
        check_sampling(request.sampling, len(request.contexts), config)
        if len(request.stops) != len(request.contexts):
            raise HTTPException(422, "stops: one list of stop strings per context")
        for index, (ids, stop) in enumerate(zip(request.contexts, request.stops, strict=True)):
            check_stops(stop, config, f"stops[{index}]")
            if not 0 < len(ids) < config.engine.max_model_len:
                raise HTTPException(
                    400,
                    f"contexts[{index}]: {len(ids)} tokens; a context has 1 to "
                    f"{config.engine.max_model_len - 1} (no room for a completion beyond)",
                )
        contexts = [
            Context(ids, tuple(stop))
            for ids, stop in zip(request.contexts, request.stops, strict=True)
        ]
        with lock:
            groups = served(lambda: sampler.complete(contexts, request.sampling))
        return {"completions": [[list(completion) for completion in group] for group in groups]}

    @app.post("/refresh")
    def refresh(request: RefreshRequest) -> dict[str, Any]:
        checkpoint = checkpoint_folder(request.checkpoint, config.checkpoint_root)
        with lock:
            died = getattr(sampler, "failure", lambda: None)()
            if died is not None:
                raise HTTPException(503, f"the engine can no longer serve: {died}")
            try:
                diff = sampler.refresh(checkpoint, request.expected_probe)
            except WeightSyncError as exc:
                raise HTTPException(409, str(exc)) from exc
            except Exception as exc:
                unknown_weights[:] = [
                    f"a refresh from {checkpoint} broke off while loading ({type(exc).__name__}:"
                    f" {exc}): the served weights are unknown until a refresh succeeds"
                ]
                raise HTTPException(409, unknown_weights[0]) from exc
            unknown_weights.clear()
        return {"probe_diff": None if math.isnan(diff) else diff}  # NaN: nothing checked

    @app.get("/probe")
    def probe() -> dict[str, Any]:
        with lock:
            return {"logprobs": served(sampler.probe_logprobs)}

    return app


def request_errors() -> tuple[type[Exception], ...]:
    """What an engine raises for a request it will not take: vLLM's own validation errors
    (when vLLM is loaded: the hf backend runs without it) and ``ValueError``."""
    vllm_exceptions = sys.modules.get("vllm.exceptions")
    client = getattr(vllm_exceptions, "VLLMClientError", None)
    return (ValueError,) if client is None else (ValueError, client)


def check_sample_request(request: SampleRequest, config: SampleServerConfig) -> None:
    """Refuse a request past the server's bounds before the engine sees it (200 stop strings
    once cost 210 s and 1 GB on the hf backend for 4 tokens)."""
    check_sampling(request.sampling, len(request.prompts), config, "prompts")


def check_sampling(
    sampling: SamplingConfig, count: int, config: SampleServerConfig, what: str = "contexts"
) -> None:
    """Refuse ``count`` prompts (or contexts) of ``sampling`` past the server's bounds."""
    if count > config.max_prompts:
        raise HTTPException(
            413,
            f"{what}: {count}, over the server's max_prompts {config.max_prompts}: send them in "
            "batches",
        )
    completions = count * sampling.num_generations
    if completions > config.max_completions:
        raise HTTPException(
            413,
            f"{completions} completions ({what} x sampling.num_generations), over the "
            f"server's max_completions {config.max_completions}: send them in batches",
        )
    if sampling.max_tokens > config.engine.max_model_len:
        raise HTTPException(
            422,
            f"sampling.max_tokens: {sampling.max_tokens}, over the engine's "
            f"max_model_len {config.engine.max_model_len}",
        )
    check_stops(sampling.stop, config, "sampling.stop")


def check_stops(stop: Sequence[str], config: SampleServerConfig, field: str) -> None:
    if len(stop) > config.max_stop_strings:
        raise HTTPException(
            422,
            f"{field}: {len(stop)} strings, over the server's max_stop_strings "
            f"{config.max_stop_strings}",
        )
    for index, text in enumerate(stop):
        if not text or len(text) > config.max_stop_chars:
            raise HTTPException(
                422,
                f"{field}[{index}]: {len(text)} characters; a stop string has 1 to "
                f"{config.max_stop_chars} (the server's max_stop_chars)",
            )


def check_prompt_lengths(prompts: list[Prompt], tokenizer: Any, max_model_len: int) -> None:
    """Refuse a prompt the engine's context cannot hold with one completion token: vLLM refuses
    it too, but transformers' ``generate`` would take a prompt of any length (a 16 MB one holds
    memory until the server dies)."""
    for index, prompt in enumerate(prompts):
        length = len(tokenizer.encode(prompt.model_input, add_special_tokens=False))
        if length >= max_model_len:
            raise HTTPException(
                400,
                f"prompts[{index}]: {length} tokens, no room for a completion within the "
                f"engine's max_model_len {max_model_len}",
            )


def checkpoint_folder(name: str, root: Path | None) -> Path:
    """The checkpoint folder a /refresh names, if it and every file in it lie under the
    server's checkpoint root (symbolic links resolved); before that, nothing is read there, not
    even whether it exists."""
    if root is None:
        raise HTTPException(
            403,
            "this server loads no checkpoints: start it with --checkpoint-root DIR (the folder "
            "the runs publish their checkpoints under) to serve /refresh",
        )
    try:
        root, folder = root.resolve(), Path(name).resolve()
        if not folder.is_relative_to(root):
            raise HTTPException(
                403, f"checkpoint: {name} is not under the server's checkpoint root"
            )
        if not (folder / "config.json").is_file():
            raise HTTPException(
                404,
                f"{name}: no model folder here (the server reads checkpoints from its own "
                "filesystem: the run folder must be shared, at the same path)",
            )
        outside = [e for e in folder.iterdir() if not e.resolve().is_relative_to(root)]
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a link loop, no access
        raise HTTPException(422, f"checkpoint: {exc}") from None
    if outside:
        raise HTTPException(
            403, f"checkpoint: {outside[0]} links to a file outside the server's checkpoint root"
        )
    return Path(name)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sample-server`` subcommand to a ``codepost``-style subparsers object."""
    return server_command(
        subparsers,
        "sample-server",
        SampleServerConfig,
        serve,
        TOKEN_ENV,
        example="--model.name-or-path embedded:smollm2-135m-instruct --engine.backend hf",
        help="serve a sampling engine over HTTP, for stages whose engine.server_url names it",
        description=(
            "Start a sampling engine (vLLM, or transformers with --engine.backend hf) once and "
            "serve it: POST /sample, POST /refresh (new weights from a checkpoint folder this "
            "machine can read), GET /probe, GET /engine, GET /health. Stages use it when their "
            "engine.server_url names it. Binds to 127.0.0.1 unless --host says otherwise."
        ),
    )


def serve(config: SampleServerConfig) -> int:
    """Start the engine, serve until SIGTERM or Ctrl-C, then shut the engine down."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sampler = get_sampler(config.model, config.engine)
    except ModelNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    server = http_server(
        create_app(config, sampler),
        host=config.host,
        port=config.port,
        limits=config,
        shutdown_timeout_s=None,  # a batch being sampled is answered, however long it takes
    )
    print(
        f"codepost sample-server: http://{config.host}:{config.port} ({sampler.name}, "
        f"serving {sampler.weights}{', bearer token required' if config.token else ''})",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        close_samplers()
    return 0 if server.started else 1
