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
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...verifiers.server import BEARER_REFUSED, bearer_token_matches
from ..command_line import EXIT_BAD_INPUT, settings_command
from ..data.prompts import Prompt
from ..model_config import ModelConfig, ModelNotFoundError
from ..settings import load_config
from .engines import close_samplers, get_sampler
from .remote import TOKEN_ENV, RefreshRequest, SampleRequest
from .sampling import EngineConfig, WeightSyncError


class SampleServerConfig(BaseModel):
    """What ``codepost sample-server`` serves, and where."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig, description="the weights at start")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    host: str = Field("127.0.0.1", description="interface to bind (0.0.0.0: every one)")
    port: int = Field(8020, ge=1, le=65535)
    token: str | None = Field(
        None, description=f"bearer token the clients must send (default: ${TOKEN_ENV}, else none)"
    )


def create_app(config: SampleServerConfig, sampler: Any) -> FastAPI:
    """The server's app over a started ``sampler`` (a :class:`~.sampling.Sampler`)."""
    lock = threading.Lock()  # FastAPI runs these handlers in a thread pool

    def authorized(request: Request) -> None:
        if config.token is None:
            return
        if not bearer_token_matches(request.headers.get("authorization", ""), config.token):
            raise HTTPException(401, BEARER_REFUSED, headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(title="codepost sample-server")

    @app.get("/health")  # open, for load balancers and start-up checks: it says nothing more
    def health() -> dict[str, str]:
        return {"status": "ok"}

    guarded = APIRouter(dependencies=[Depends(authorized)])

    @guarded.get("/engine")
    def engine() -> dict[str, Any]:
        return {"sampler": sampler.name, "weights": sampler.weights}

    @guarded.post("/sample")
    def sample(request: SampleRequest) -> dict[str, Any]:
        try:
            prompts = [Prompt(**prompt) for prompt in request.prompts]  # type: ignore[arg-type]
        except TypeError as exc:
            raise HTTPException(422, f"prompts: {exc}") from exc
        with lock:
            rows = sampler.sample(prompts, request.sampling, policy_version=request.policy_version)
        return {"rows": rows}

    @guarded.post("/refresh")
    def refresh(request: RefreshRequest) -> dict[str, Any]:
        checkpoint = Path(request.checkpoint)
        if not (checkpoint / "config.json").is_file():
            raise HTTPException(
                404,
                f"{checkpoint}: no model folder here (the server reads checkpoints from its "
                "own filesystem: the run folder must be shared, at the same path)",
            )
        with lock:
            try:
                diff = sampler.refresh(checkpoint, request.expected_probe)
            except WeightSyncError as exc:
                raise HTTPException(409, str(exc)) from exc
        return {"probe_diff": None if math.isnan(diff) else diff}  # NaN: nothing checked

    @guarded.get("/probe")
    def probe() -> dict[str, Any]:
        with lock:
            return {"logprobs": sampler.probe_logprobs()}

    app.include_router(guarded)
    return app


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sample-server`` subcommand to a ``codepost``-style subparsers object."""
    parser = settings_command(
        subparsers,
        "sample-server",
        SampleServerConfig,
        example="--model.name-or-path embedded:smollm2-135m-instruct --engine.backend hf",
        help="serve a sampling engine over HTTP, for stages whose engine.server_url names it",
        description=(
            "Start a sampling engine (vLLM, or transformers with --engine.backend hf) once and "
            "serve it: POST /sample, POST /refresh (new weights from a checkpoint folder this "
            "machine can read), GET /probe, GET /engine, GET /health. Stages use it when their "
            "engine.server_url names it. Binds to 127.0.0.1 unless --host says otherwise."
        ),
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(SampleServerConfig, args.config, args.settings)
    except (ValueError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if config.token is None and os.environ.get(TOKEN_ENV):
        config = config.model_copy(update={"token": os.environ[TOKEN_ENV]})
    return serve(config)


def serve(config: SampleServerConfig) -> int:
    """Start the engine, serve until SIGTERM or Ctrl-C, then shut the engine down."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sampler = get_sampler(config.model, config.engine)
    except ModelNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config, sampler), host=config.host, port=config.port, access_log=False
        )
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
