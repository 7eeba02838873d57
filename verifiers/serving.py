"""What codepost's HTTP servers (``verify-server``, ``sample-server``, ``env-server``) do before
a request reaches a route: the bearer token, checked before the body is read (and before a
WebSocket is accepted); the body's size and the time it takes to arrive; and, below HTTP, a cap
on open connections and a time-out on the headers of each request, so idle or slow-dripping
connections (slowloris) cannot hold the server's file descriptors or its shutdown."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field, model_validator
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from uvicorn.protocols.http.auto import AutoHTTPProtocol

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BEARER_REFUSED = "missing or wrong bearer token (Authorization: Bearer ...)"
MAX_ERRORS = 10  # validation errors named in one answer, each in at most MAX_ERROR_CHARS
MAX_ERROR_CHARS = 300


class JSONAnswer(JSONResponse):
    """JSON with every character past ASCII escaped, so that text a caller sent, echoed back
    (a lone surrogate in a sample's field), can always be written."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def answer_errors_plainly(app: FastAPI) -> None:
    """Refusals as ``{"detail": ...}`` with their headers, and validation errors as one short
    line: malformed JSON is a 400 naming the position; otherwise a 422 names at most
    ``MAX_ERRORS`` errors of at most ``MAX_ERROR_CHARS`` each, then how many more there were (a
    list of 500,000 wrong items once made a 25.9 MB answer)."""

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> JSONAnswer:
        return JSONAnswer({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONAnswer:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            detail = (
                f"malformed JSON: {errors[0]['ctx']['error']} at position {errors[0]['loc'][1]}"
            )
            return JSONAnswer({"detail": detail}, status_code=400)
        parts = [
            f"{'.'.join(map(str, error['loc'][1:])) or 'body'}: {error['msg']}"[:MAX_ERROR_CHARS]
            for error in errors[:MAX_ERRORS]
        ]
        if len(errors) > MAX_ERRORS:
            parts.append(f"and {len(errors) - MAX_ERRORS} more errors")
        return JSONAnswer({"detail": "; ".join(parts)}, status_code=422)


def _printable_ascii(token: str | None) -> str | None:
    """A token a client can send in a header: an empty one would let in anyone who sends
    ``Bearer``, and one past ASCII could never match what HTTP clients send."""
    if token is not None and not (token and all("!" <= c <= "~" for c in token)):
        raise ValueError(
            "a bearer token must be one or more printable ASCII characters, without spaces "
            f"(HTTP headers carry ASCII); got {'an empty one' if not token else 'other text'}"
            ": set another, or unset it for a server without one"
        )
    return token


BearerToken = Annotated[str | None, AfterValidator(_printable_ascii)]


def bearer_token_matches(authorization: bytes, token: str) -> bool:
    """Whether an ``Authorization`` header's bytes carry ``token`` (compared in constant time)."""
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given, token.encode())


def basic_password_matches(authorization: bytes, token: str) -> bool:
    """Whether an ``Authorization: Basic`` header's password is ``token``: what a WebSocket
    client that sets no headers of its own sends for a URL's credentials
    (``ws://codepost:TOKEN@host/ws``; OpenEnv's client, a browser's)."""
    scheme, _, encoded = authorization.partition(b" ")
    if scheme.lower() != b"basic":
        return False
    try:
        _, _, password = base64.b64decode(encoded, validate=True).partition(b":")
    except binascii.Error:
        return False
    return hmac.compare_digest(password, token.encode())


class HTTPLimits(BaseModel):
    """The bounds every codepost server puts on its callers before any route runs."""

    token: BearerToken = Field(None, description="bearer token every request but /health needs")
    max_body_bytes: int = Field(16 << 20, ge=1024, description="largest request body")
    body_timeout_s: float = Field(
        60.0, gt=0, description="a request body must arrive whole within this time: else 408"
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection must send a request's headers whole within this time of "
        "its first byte (or of opening): else it is closed",
    )
    max_header_bytes: int = Field(
        64 << 10, ge=1024, description="a request's headers at most: else 431, and it is closed"
    )
    max_connections: int = Field(
        512, ge=1, description="open connections at once; past it, a new one is answered 503"
    )
    max_pending_bytes: int = Field(
        256 << 20,
        ge=1024,
        description="request bodies held at once (being read, queued or running); past it, "
        "refused at once with Retry-After. At least max_body_bytes",
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After of a busy server's refusal")

    @model_validator(mode="after")
    def _one_body_fits(self) -> HTTPLimits:
        if self.max_pending_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_pending_bytes {self.max_pending_bytes} is below max_body_bytes "
                f"{self.max_body_bytes}: no body of the largest size could ever be accepted"
            )
        return self


def busy(status: int, what: str, retry_after_s: int) -> HTTPException:
    """A refusal of work the server has no room for now, and when to try again."""
    return HTTPException(
        status,
        f"server busy: {what}; retry after {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


class BodyBudget:
    """The bytes of request bodies a server holds at once (being read, queued or running):
    a body past ``capacity`` is refused at once with ``status`` and Retry-After. Used from the
    event loop only, so it needs no lock."""

    def __init__(self, capacity: int, retry_after_s: int, status: int) -> None:
        self.capacity, self.retry_after_s, self.status = capacity, retry_after_s, status
        self.held = 0

    def hold(self, size: int) -> None:
        """Count ``size`` more bytes of a body, or raise the refusal when they do not fit."""
        if self.held + size > self.capacity:
            what = f"{self.held} of {self.capacity} bytes of requests held"
            raise busy(self.status, what, self.retry_after_s)
        self.held += size


class HeldBodies:
    """ASGI middleware behind the :class:`Guard`: the bytes of the bodies held at once, in a
    :class:`BodyBudget` (a declared length is counted before the body is read, a chunked body
    as it arrives, until the answer is sent). Every body is JSON, whatever its declared type
    (curl -d says a form)."""

    def __init__(self, app: ASGIApp, *, budget: BodyBudget) -> None:
        self.app, self.budget = app, budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = [0]  # bytes of this request's body counted in the budget
        try:
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit():
                try:
                    self.budget.hold(int(length))
                except HTTPException as refused:
                    refusal = JSONAnswer(
                        {"detail": refused.detail},
                        status_code=refused.status_code,
                        headers=refused.headers,
                    )
                    await refusal(scope, receive, send)
                    return
                held[0] = int(length)
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            await self.app(scope, self.counted(receive, held), send)
        finally:
            self.budget.held -= held[0]

    def counted(self, receive: Receive, held: list[int]) -> Receive:
        received = 0

        async def receive_counted() -> MutableMapping[str, Any]:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > held[0]:  # no Content-Length, or more than it said
                self.budget.hold(received - held[0])
                held[0] = received
            return message

        return receive_counted


class Guard:
    """ASGI middleware in front of a server's routes: the bearer token (before the body is
    read), the body's size (a declared length refused before the body is read, a chunked body
    as soon as it passes the limit: 413) and its time (408 when it has not arrived whole
    within ``body_timeout_s``). A WebSocket handshake needs the token too, as a bearer token or
    as its URL's password, or is answered 401 instead of accepted."""

    def __init__(self, app: ASGIApp, *, limits: HTTPLimits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self.handshake(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
        else:
            await self.app(scope, self.limited(receive), send)

    async def handshake(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.limits.token
        authorization = dict(scope["headers"]).get(b"authorization", b"")
        if token is None or any(
            matches(authorization, token)
            for matches in (bearer_token_matches, basic_password_matches)
        ):
            await self.app(scope, receive, send)
            return
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})  # 403: all the server can say
            return
        body = json.dumps({"detail": BEARER_REFUSED}).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})

    def refusal(self, scope: Scope) -> JSONAnswer | None:
        headers = dict(scope["headers"])
        token = self.limits.token
        if (
            token is not None
            and scope["path"] != "/health"  # open, for load balancers and start-up checks
            and not bearer_token_matches(headers.get(b"authorization", b""), token)
        ):
            return JSONAnswer(
                {"detail": BEARER_REFUSED}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
        length = headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limits.max_body_bytes:
            return JSONAnswer(
                {"detail": self.too_large()}, status_code=413, headers={"Connection": "close"}
            )
        return None

    def too_large(self) -> str:
        return f"request body over the server's limit of {self.limits.max_body_bytes} bytes"

    def limited(self, receive: Receive) -> Receive:
        received = 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        whole = False

        async def receive_limited() -> MutableMapping[str, Any]:
            nonlocal received, whole
            if whole:  # the body is in: later receives wait for a disconnect, unbounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise HTTPException(
                    408,
                    f"request body not received whole within the server's "
                    f"{self.limits.body_timeout_s:g} s",
                    headers={"Connection": "close"},
                ) from None
            received += len(message.get("body", b""))
            whole = not message.get("more_body", False)
            if received > self.limits.max_body_bytes:
                raise HTTPException(413, self.too_large(), headers={"Connection": "close"})
            return message

        return receive_limited


def _refuse(transport: asyncio.Transport, status: bytes, text: bytes) -> None:
    """Answer ``status`` below the app, then close: the request never reaches it."""
    transport.write(
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain\r\ncontent-length: "
        + str(len(text)).encode() + b"\r\nconnection: close\r\n\r\n" + text
    )  # fmt: skip
    transport.close()


def _guarded_protocol(limits: HTTPLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) with a connection cap, a cap on a request's
    header bytes (httptools buffers a header line of any length) and a header time-out: the
    timer starts when a connection opens or, between requests, at the next request's first
    byte, and closes the connection if no new request's headers are whole by then (uvicorn's
    own keep-alive time-out covers idle kept-alive connections)."""

    class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        header_timer: asyncio.TimerHandle | None = None
        header_bytes = 0  # received since the last request began, none of it a request yet

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                _refuse(transport, b"503 Service Unavailable", b"too many connections at once\n")
                return
            self.arm_header_timer()

        def data_received(self, data: bytes) -> None:
            idle, before = self.cycle is None or self.cycle.response_complete, self.cycle
            if idle:
                self.arm_header_timer()
            super().data_received(data)
            if self.transport.get_protocol() is not self:  # upgraded to a WebSocket's protocol
                self.disarm_header_timer()
            elif self.cycle is not before:  # a request began: its headers were whole
                self.header_bytes = 0
            elif idle and not self.transport.is_closing():
                self.header_bytes += len(data)
                if self.header_bytes > limits.max_header_bytes:
                    _refuse(
                        self.transport,
                        b"431 Request Header Fields Too Large",
                        b"request headers over %d bytes\n" % limits.max_header_bytes,
                    )

        def connection_lost(self, exc: Exception | None) -> None:
            self.disarm_header_timer()
            super().connection_lost(exc)

        def disarm_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def arm_header_timer(self) -> None:
            if self.header_timer is None:
                self.header_timer = self.loop.call_later(
                    limits.header_timeout_s, self.headers_late, self.cycle
                )

        def headers_late(self, cycle: object) -> None:
            self.header_timer = None
            if self.cycle is cycle and not self.transport.is_closing():  # no request began
                self.transport.close()

    return GuardedProtocol


def http_server(
    app: ASGIApp, *, host: str, port: int, limits: HTTPLimits, shutdown_timeout_s: int | None
) -> uvicorn.Server:
    """A uvicorn server for ``app`` with ``limits`` on its connections (a WebSocket message
    at most ``max_body_bytes``, as a request body)."""
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=False,
            http=_guarded_protocol(limits),
            ws_max_size=limits.max_body_bytes,
            timeout_graceful_shutdown=shutdown_timeout_s,
        )
    )
