"""``codepost env-server``: the registered environments (``environments``) over HTTP and
WebSocket in OpenEnv's shape, so that another trainer trains against codepost's sandbox.

* ``WS /ws``: OpenEnv's session protocol, which its clients (``openenv-core``'s
  ``GenericEnvClient``) speak: one episode per connection; messages ``reset`` (``data``: which
  problem, which environment), ``step`` (``data``: ``{"answer": ...}``), ``state`` and
  ``close``; answers ``{"type": "observation", "data": {"observation", "reward", "done"}}``,
  ``state``, or ``error`` with the HTTP status the same mistake gets over HTTP;
* ``POST /reset``, ``POST /step``, ``GET /state``, ``POST /close``: the same over HTTP, the
  session named by the ``session_id`` its reset returned;
* ``GET /health``, ``GET /metadata``, ``GET /schema``.

An observation is ``{"text", "task_id", "turn", "info"}``: the text the model reads next (the
problem at a reset, the environment's reply after a step; empty once done). The reward is
None until the episode is done, then its final answer's outcome on every test (None still
if the sandbox could not run it).

Sessions share nothing but the sandbox pool: each has its own environment and episode, is
named by an unguessable id (HTTP) or is its connection (WebSocket), and is closed after
``session_idle_s`` untouched; at most ``max_sessions`` are open, and a reset past that is
answered 503 with Retry-After. The bearer token, the body and connection bounds are the verify
server's (``serving``); a WebSocket client that cannot set headers may send the token as its
URL's password (``ws://codepost:TOKEN@host:port``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException

from ..sandbox import Limits, SandboxPool, SandboxUnavailable
from ..settings.command_line import server_command
from .environments import Environment, Episode, environments
from .extraction import MAX_COMPLETION_CHARS
from .forms import describe_validation, form_of
from .options import TOKEN_ENV
from .problems import HUMANEVAL, NAMED_PROBLEMS, Problem
from .rewards import RewardConfig
from .server.app import pool_app
from .server.command import serve_pool
from .server.config import PoolServerConfig
from .server.verify import (
    MAX_DEPTH,
    check_test_counts,
    named_or_inline,
    named_problems,
    nesting_depth,
    within_caps,
)
from .serving import BodyBudget, JSONAnswer, busy

DEFAULT_ENVIRONMENT = "execution-feedback"
# OpenEnv's error codes (openenv.core.env_server.types.WSErrorCode) for an error message
WS_ERROR_CODES = {404: "VALIDATION_ERROR", 409: "SESSION_ERROR", 503: "CAPACITY_REACHED"}


class EnvServerConfig(PoolServerConfig):
    """``env-server``'s: its pool, its sessions and the answers it takes."""

    port: int = Field(8000, ge=0, le=65535, description="TCP port (OpenEnv's is 8000)")
    max_sessions: int = Field(
        64,
        ge=1,
        description="episodes open at once (HTTP sessions and WebSockets together); past it, "
        "a reset is refused with 503 and Retry-After",
    )
    session_idle_s: float = Field(
        600.0, gt=0, description="a session untouched this long is closed (a WebSocket too)"
    )
    max_turns: int = Field(
        4, ge=1, le=64, description="answers per episode at most, whatever its config asks"
    )
    max_answer_chars: int = Field(
        64 << 10,
        ge=1,
        le=MAX_COMPLETION_CHARS,
        description="longest answer a step takes; past it, 413",
    )


class ResetRequest(BaseModel):
    """Which problem an episode poses, in which environment: a named set's ``task_id``, or a
    ``problem`` record inline (any schema codepost reads)."""

    model_config = ConfigDict(extra="forbid")

    environment: str = DEFAULT_ENVIRONMENT
    problems: str = Field(HUMANEVAL, description=f"one of {', '.join(NAMED_PROBLEMS)}")
    task_id: str | None = None
    problem: dict[str, Any] | None = None
    config: dict[str, Any] = Field(
        default_factory=dict, description="the environment's settings (its config model)"
    )

    @field_validator("problem")
    @classmethod
    def _shallow(cls, record: dict[str, Any] | None) -> dict[str, Any] | None:
        if record is not None and nesting_depth(record) > MAX_DEPTH:
            raise ValueError(f"nested over {MAX_DEPTH} levels deep")
        return record


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str  # the model's whole answer, as a chat model writes it (a fenced block)


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    action: Action


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str


@dataclass
class Session:
    """One episode's server side: its own environment and episode, nothing shared."""

    environment: Environment | None = None
    episode: Episode | None = None
    last_used: float = field(default_factory=time.monotonic)
    stepping: bool = False
    connected: bool = False  # a WebSocket's: its connection closes it


class Sessions:
    """The sessions open, at most ``capacity``, each closed after ``idle_s`` untouched (found
    so on the next look-up). Used from the event loop only, so it needs no lock."""

    def __init__(self, capacity: int, idle_s: float, retry_after_s: int) -> None:
        self.capacity, self.idle_s, self.retry_after_s = capacity, idle_s, retry_after_s
        self.open: dict[str, Session] = {}

    def start(self) -> tuple[str, Session]:
        self.close_idle()
        if len(self.open) >= self.capacity:
            what = f"{len(self.open)} of {self.capacity} sessions open"
            raise busy(503, what, self.retry_after_s)
        session_id = secrets.token_urlsafe(18)
        self.open[session_id] = session = Session()
        return session_id, session

    def get(self, session_id: str) -> Session:
        self.close_idle()
        session = self.open.get(session_id)
        if session is None:
            raise HTTPException(
                404,
                f"no session {session_id[:64]!r}: never opened, closed, or closed after "
                f"{self.idle_s:g} s idle; reset to open one",
            )
        session.last_used = time.monotonic()
        return session

    def close_idle(self) -> None:
        now = time.monotonic()
        for session_id, session in list(self.open.items()):
            idle = now - session.last_used > self.idle_s
            if idle and not (session.stepping or session.connected):
                del self.open[session_id]


class EnvService:
    """What the routes do, whichever transport brought the request."""

    def __init__(self, config: EnvServerConfig, pool: SandboxPool) -> None:
        self.config, self.pool = config, pool
        self.limits = Limits(job_time_s=config.max_job_s)

    async def reset(self, session: Session, request: ResetRequest) -> dict[str, Any]:
        environment = self.environment(request)
        # off the event loop: an inline problem's test code is parsed, a public view built
        episode = await asyncio.to_thread(lambda: environment.reset(self.problem(request)))
        session.environment, session.episode = environment, episode
        session.last_used = time.monotonic()
        return observation(episode, episode.observation, {}, None)

    def environment(self, request: ResetRequest) -> Environment:
        known = environments()
        chosen = known.get(request.environment)
        if chosen is None:
            raise HTTPException(
                404,
                f"unknown environment {request.environment!r} (known: {', '.join(known)})",
            )
        try:
            settings = chosen.config_model.model_validate(request.config)
        except ValidationError as exc:
            raise HTTPException(422, f"config: {describe_validation(exc)}") from None
        return chosen(self.pool, limits=self.limits, reward_config=RewardConfig(), config=settings)

    def problem(self, request: ResetRequest) -> Problem:
        """The problem a reset names, within the server's caps."""
        if request.problem is not None and request.task_id is None:
            problems = named_or_inline([request.problem], self.config)
            check_test_counts(problems, self.config, "send fewer")
        elif request.task_id is not None and request.problem is None:
            if request.problems not in NAMED_PROBLEMS:
                raise HTTPException(
                    404,
                    f"unknown problem set {request.problems!r}: named sets are "
                    f"{', '.join(NAMED_PROBLEMS)}; send other problems inline (problem)",
                )
            named = named_problems(request.problems)
            if request.task_id not in named:
                raise HTTPException(
                    404,
                    f"unknown problem {request.task_id[:200]!r} in {request.problems!r} "
                    f"({len(named)} problems)",
                )
            problems = {request.task_id: named[request.task_id]}
        else:
            raise HTTPException(
                422, "name one problem: a task_id (of problems) or a problem record"
            )
        (problem,) = within_caps(problems, self.config).values()
        runs = form_of(problem).languages
        if problem.language not in runs:
            raise HTTPException(
                422,
                f"problem {problem.task_id!r} is in {problem.language!r}; its tests "
                f"({problem.test_form}) run {', '.join(runs)} here",
            )
        return problem

    async def step(self, session: Session, action: Action) -> dict[str, Any]:
        episode, environment = session.episode, session.environment
        if episode is None or environment is None:
            raise HTTPException(409, "no episode in this session: reset first")
        if episode.done:
            raise HTTPException(
                409,
                f"the episode of {episode.problem.task_id!r} is done after "
                f"{len(episode.answers)} answers: reset to start another",
            )
        if len(action.answer) > self.config.max_answer_chars:
            raise HTTPException(
                413,
                f"the answer is {len(action.answer)} characters, over the server's "
                f"max_answer_chars {self.config.max_answer_chars}",
            )
        if session.stepping:
            raise HTTPException(409, "a step of this session is still running")
        session.stepping = True
        try:
            (reply,) = await asyncio.to_thread(environment.feedback, [episode], [action.answer])
            info = dict(reply.info)
            if not episode.done and len(episode.answers) >= self.config.max_turns:
                episode.done, info["end"] = True, "turns"  # the server's bound on every episode
            reward = None
            if episode.done:
                (reward,) = await asyncio.to_thread(environment.score, [episode])
        finally:
            session.stepping = False
            session.last_used = time.monotonic()
        return observation(episode, reply.observation if not episode.done else "", info, reward)


def observation(
    episode: Episode, text: str | None, info: dict[str, Any], reward: float | None
) -> dict[str, Any]:
    """OpenEnv's observation answer: the observation's fields, its reward and whether done."""
    return {
        "observation": {
            "text": text or "",
            "task_id": episode.problem.task_id,
            "turn": len(episode.answers),
            "info": info,
        },
        "reward": reward,
        "done": episode.done,
    }


def state(session_id: str, session: Session) -> dict[str, Any]:
    """OpenEnv's state (``episode_id``, ``step_count``) and what the episode is."""
    episode = session.episode
    return {
        "episode_id": session_id,
        "step_count": 0 if episode is None else len(episode.answers),
        "environment": None if session.environment is None else session.environment.name,
        "task_id": None if episode is None else episode.problem.task_id,
        "done": episode is not None and episode.done,
    }


def create_app(config: EnvServerConfig, pool: SandboxPool) -> FastAPI:
    """The server's app over a started ``pool``, which stays the caller's to close."""
    sessions = Sessions(config.max_sessions, config.session_idle_s, config.retry_after_s)
    service = EnvService(config, pool)
    app = pool_app(
        "codepost env-server",
        "codepost's environments in OpenEnv's shape: reset, step, state",
        config,
        BodyBudget(config.max_pending_bytes, config.retry_after_s, 429),
    )
    app.state.sessions = sessions

    @app.post("/reset")
    async def reset(request: ResetRequest) -> JSONAnswer:
        session_id, session = sessions.start()
        try:
            answer = await service.reset(session, request)
        except BaseException:
            sessions.open.pop(session_id, None)
            raise
        answer["observation"]["session_id"] = session_id
        return JSONAnswer(answer)

    @app.post("/step")
    async def step(request: StepRequest) -> JSONAnswer:
        return JSONAnswer(await service.step(sessions.get(request.session_id), request.action))

    @app.get("/state")
    async def get_state(session_id: str) -> JSONAnswer:
        return JSONAnswer(state(session_id, sessions.get(session_id)))

    @app.post("/close")
    async def close(request: SessionRequest) -> JSONAnswer:
        sessions.get(request.session_id)
        del sessions.open[request.session_id]
        return JSONAnswer({"closed": request.session_id})

    @app.websocket("/ws")
    async def websocket(socket: WebSocket) -> None:
        await socket.accept()
        try:
            session_id, session = sessions.start()
        except HTTPException as exc:
            await socket.send_text(json.dumps(ws_error(exc)))
            await socket.close()
            return
        session.connected = True
        try:
            await ws_session(socket, service, session_id, session, config.session_idle_s)
        finally:
            sessions.open.pop(session_id, None)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "healthy",
            "environments": list(environments()),
            "problems": list(NAMED_PROBLEMS),
            "sessions": len(sessions.open),
            "max_sessions": config.max_sessions,
            "session_idle_s": config.session_idle_s,
            "max_turns": config.max_turns,
            "max_answer_chars": config.max_answer_chars,
            "workers": config.workers,
        }

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        known = environments()
        return {
            "name": "codepost",
            "description": "code problems answered over turns, run in codepost's sandbox",
            "environments": {name: (env.__doc__ or "").strip() for name, env in known.items()},
        }

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": Action.model_json_schema(),
            "reset": ResetRequest.model_json_schema(),
            "configs": {
                name: env.config_model.model_json_schema() for name, env in environments().items()
            },
        }

    return app


async def ws_session(
    socket: WebSocket, service: EnvService, session_id: str, session: Session, idle_s: float
) -> None:
    """One connection's episode: each message answered in order until ``close``, a
    disconnect, or ``idle_s`` without a message."""
    while True:
        try:
            raw = await asyncio.wait_for(socket.receive_text(), idle_s)
        except TimeoutError:
            idle = HTTPException(408, f"the session was idle {idle_s:g} s: closed")
            await socket.send_text(json.dumps(ws_error(idle)))
            await socket.close()
            return
        except WebSocketDisconnect:
            return
        try:
            answer = await ws_answer(raw, service, session_id, session)
        except HTTPException as exc:
            answer = ws_error(exc)
        except ValidationError as exc:
            answer = ws_error(HTTPException(422, describe_validation(exc)))
        except SandboxUnavailable as exc:
            answer = ws_error(HTTPException(503, f"sandbox unavailable: {exc}"))
        if answer is None:
            await socket.close()
            return
        await socket.send_text(json.dumps(answer, allow_nan=False))
        session.last_used = time.monotonic()


async def ws_answer(
    raw: str, service: EnvService, session_id: str, session: Session
) -> dict[str, Any] | None:
    """The answer to one of OpenEnv's messages; None for ``close``."""
    try:
        message = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"malformed JSON: {exc}") from None
    kind = message.get("type") if isinstance(message, dict) else None
    data = message.get("data", {}) if isinstance(message, dict) else None
    if kind == "reset":
        reset = ResetRequest.model_validate(data)
        return {"type": "observation", "data": await service.reset(session, reset)}
    if kind == "step":
        action = Action.model_validate(data)
        return {"type": "observation", "data": await service.step(session, action)}
    if kind == "state":
        return {"type": "state", "data": state(session_id, session)}
    if kind == "close":
        return None
    raise HTTPException(
        400, f"a message is a JSON object whose type is reset, step, state or close; got {kind!r}"
    )


def ws_error(exc: HTTPException) -> dict[str, Any]:
    """OpenEnv's error message, with the HTTP status the same mistake gets over HTTP."""
    code = WS_ERROR_CODES.get(exc.status_code, "VALIDATION_ERROR")
    if exc.status_code >= 500 and exc.status_code != 503:
        code = "EXECUTION_ERROR"
    return {
        "type": "error",
        "data": {"message": exc.detail, "code": code, "status": exc.status_code},
    }


# -- the command


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``env-server`` subcommand to a ``codepost``-style subparsers object."""
    return server_command(
        subparsers,
        "env-server",
        EnvServerConfig,
        serve,
        TOKEN_ENV,
        example="--port 8000 --workers 4 --max-sessions 64",
        help="serve the environments (multi-turn episodes) in OpenEnv's shape",
        description=(
            "Serve codepost's registered environments on the warm sandbox pool, in OpenEnv's "
            "shape: WS /ws (OpenEnv's session protocol), POST /reset, POST /step, GET /state, "
            "POST /close, GET /health, /metadata and /schema. Binds to 127.0.0.1 unless --host "
            f"says otherwise; the bearer token is ${TOKEN_ENV} unless --token gives one. SIGTERM "
            "lets the accepted requests finish, then removes the containers."
        ),
    )


def serve(config: EnvServerConfig) -> int:
    return serve_pool(
        "env-server",
        config,
        functools.partial(create_app, config),
        f"up to {config.max_sessions} sessions",
        lambda app: f"{len(app.state.sessions.open)} sessions open at the end",
    )
