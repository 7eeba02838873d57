"""``codepost verify --server URL``: the verifier's work sent to a running ``codepost
verify-server`` (its warm pool), with the same verdicts as a pool of one's own.

Samples are checked here first, so a bad one stops the command before anything runs, as
without a server. They go out in batches, several at once; a batch the server refuses as busy
(429) is sent again after its Retry-After, so none is lost.

The HTTP client is the standard library's: an HTTP library's import (httpx: 0.09 s) was a
quarter of this command's start, and the server waits for its first batch meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..sandbox import SandboxUnavailable
from .options import VerifyOptions
from .problems import NAMED_PROBLEMS, Problem
from .verdicts import Verdict
from .verifier import Verifier

BATCH = 32  # samples per request
IN_FLIGHT = 4  # requests at once: enough to keep a server's containers busy
CONNECT_S = 10.0  # then no time-out: a batch waits for its turn on the server's containers


class RemoteVerifier:
    def __init__(
        self,
        url: str,
        source: str,
        options: VerifyOptions | None = None,
        *,
        token: str | None = None,
    ) -> None:
        """``source`` is what the problems were loaded from: a set the server ships is sent by
        name (the server poses it in ``options.language`` and caps its tests), any other
        problem inline, as posed and capped here, with the samples that need it."""
        self.url = url.rstrip("/")
        self.address = urllib.parse.urlsplit(self.url)
        self.source = source
        # the request's options: VerifyOptions' own fields, of a subclass too (verify's config)
        sent = (options or VerifyOptions()).model_dump(include=set(VerifyOptions.model_fields))
        if source not in NAMED_PROBLEMS:
            sent["language"] = None  # posed here already
        self.options = VerifyOptions.model_validate(sent)
        # checks samples; never starts a pool
        self.local = Verifier(
            reward_config=self.options.reward_config(),
            completion_style=self.options.completion_style,
        )
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.connections: list[http.client.HTTPConnection] = []  # one per thread, kept alive
        self.thread = threading.local()  # its connection

    def close(self, abort: bool = False) -> None:
        """``abort`` as in ``Verifier.close``: a batch in flight is the server's to finish."""
        for connection in self.connections:
            connection.close()

    def __enter__(self) -> RemoteVerifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def iter_verify(
        self, problems: Mapping[str, Problem], samples: Iterable[Mapping[str, Any]]
    ) -> Iterator[tuple[int, Verdict]]:
        """``(sample index, verdict)`` as each batch comes back; raises ``SampleError`` now, and
        ``SandboxUnavailable`` (naming the server) when the server cannot do the work."""
        samples = list(samples)
        self.local.check(problems, samples)
        return self._run(problems, samples)

    def _run(
        self, problems: Mapping[str, Problem], samples: list[Mapping[str, Any]]
    ) -> Iterator[tuple[int, Verdict]]:
        capacity = self._request("GET", "/health")["max_pending"]
        size = max(1, min(BATCH, capacity))
        threads = concurrent.futures.ThreadPoolExecutor(max(1, min(IN_FLIGHT, capacity // size)))
        try:
            batches = {
                threads.submit(self._verify_batch, problems, samples[start : start + size]): start
                for start in range(0, len(samples), size)
            }
            for batch in concurrent.futures.as_completed(batches):
                for offset, row in enumerate(batch.result()):
                    yield batches[batch] + offset, Verdict.model_validate(row)
        finally:
            threads.shutdown(wait=False, cancel_futures=True)

    def _verify_batch(
        self, problems: Mapping[str, Problem], batch: list[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        if self.source in NAMED_PROBLEMS:
            sent: str | list[dict[str, Any]] = self.source
        else:
            needed = dict.fromkeys(str(sample["task_id"]) for sample in batch)
            sent = [problems[task_id].model_dump(mode="json") for task_id in needed]
        body = {"samples": batch, "problems": sent, **self.options.model_dump(mode="json")}
        return self._request("POST", "/verify", body)["verdicts"]

    def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """The answer's JSON; a busy server is asked again after its Retry-After."""
        data = None if body is None else json.dumps(body).encode()
        while True:
            response, answer = self._exchange(method, self.address.path + path, data)
            if response.status != 429:
                break
            time.sleep(float(response.getheader("Retry-After", "1")))
        if response.status != 200:
            try:
                detail = json.loads(answer)["detail"]
            except (ValueError, KeyError, TypeError):
                detail = answer[:500].decode(errors="replace")
            raise SandboxUnavailable(
                f"the verify server {self.url} answered {response.status}: {detail}"
            )
        return json.loads(answer)

    def _exchange(
        self, method: str, path: str, data: bytes | None
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """One request on this thread's connection. A kept-alive connection the server has
        closed meanwhile (it closes idle ones) is replaced once; the work is sent again."""
        connection = getattr(self.thread, "connection", None)
        reused = connection is not None
        while True:
            if connection is None:
                connection = self._connect()
            try:
                connection.request(method, path, body=data, headers=self.headers)
                response = connection.getresponse()
                return response, response.read()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                connection = self.thread.connection = None
                if not reused:
                    raise SandboxUnavailable(
                        f"cannot reach the verify server {self.url}: {exc!r}"
                    ) from exc
                reused = False

    def _connect(self) -> http.client.HTTPConnection:
        host, scheme = self.address.hostname, self.address.scheme
        if scheme not in ("http", "https") or not host:
            raise SandboxUnavailable(f"{self.url} is not the http(s) URL of a verify server")
        try:
            port = self.address.port
            if scheme == "https":
                import ssl  # its certificates take 0.1 s to load: only for a TLS server

                connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=CONNECT_S, context=ssl.create_default_context()
                )
            else:
                connection = http.client.HTTPConnection(host, port, timeout=CONNECT_S)
            connection.connect()
        except (OSError, ValueError) as exc:  # ValueError: a port that is not a number
            raise SandboxUnavailable(f"cannot reach the verify server {self.url}: {exc!r}") from exc
        connection.sock.settimeout(None)
        self.thread.connection = connection
        self.connections.append(connection)
        return connection
