"""A sampler whose engine is a running ``codepost sample-server``: what the stages use when
``EngineConfig.server_url`` names one, and the requests it sends."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from ..data.prompts import Prompt
from ..data.rows import Completion, Context
from .sampling import PROBE_LENGTH, SamplingConfig, WeightSyncError

TOKEN_ENV = "CODEPOST_SAMPLER_TOKEN"
MAX_PROMPTS = 1 << 16  # in one request: a list is refused by its length before its items
BUSY_WAIT_S = 3600.0  # how long a request is sent again while the server is busy


class SampleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompts: list[dict[str, str]] = Field(max_length=MAX_PROMPTS)
    sampling: SamplingConfig
    policy_version: int = 0


class CompleteRequest(BaseModel):
    """Completions of token-id contexts (an episode's next turn): ``stops`` are each
    context's own stop strings."""

    model_config = ConfigDict(extra="forbid")

    contexts: list[list[int]] = Field(max_length=MAX_PROMPTS)
    stops: list[list[str]] = Field(max_length=MAX_PROMPTS)
    sampling: SamplingConfig


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str
    expected_probe: list[float] | None = Field(None, max_length=PROBE_LENGTH)


class RemoteSampler:
    """A :class:`~.sampling.Sampler` whose engine is a running ``codepost sample-server``."""

    def __init__(self, url: str, *, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # No read time-out: a batch takes as long as its completions.
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(None, connect=10.0))
        engine = self._call("GET", "/engine")
        self.name: str = engine["sampler"]
        self.weights: str = engine["weights"]

    def sample(
        self, prompts: Sequence[Prompt], config: SamplingConfig, *, policy_version: int = 0
    ) -> list[dict[str, Any]]:
        body = SampleRequest(
            prompts=[dataclasses.asdict(prompt) for prompt in prompts],
            sampling=config,
            policy_version=policy_version,
        )
        return self._call("POST", "/sample", body.model_dump(mode="json"))["rows"]

    def complete(
        self, contexts: Sequence[Context], config: SamplingConfig
    ) -> list[list[Completion]]:
        body = CompleteRequest(
            contexts=[context.ids for context in contexts],
            stops=[list(context.stop) for context in contexts],
            sampling=config,
        )
        groups = self._call("POST", "/complete", body.model_dump(mode="json"))["completions"]
        return [[Completion(*completion) for completion in group] for group in groups]

    def refresh(self, checkpoint: Path, expected_probe: list[float] | None = None) -> float:
        body = RefreshRequest(checkpoint=str(checkpoint), expected_probe=expected_probe)
        diff = self._call("POST", "/refresh", body.model_dump())["probe_diff"]
        self.weights = str(checkpoint)
        return float("nan") if diff is None else diff

    def probe_logprobs(self) -> list[float]:
        return self._call("GET", "/probe")["logprobs"]

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """The server's answer; a busy server (503 with Retry-After: other requests' bodies
        fill its budget) is asked again when it says, for up to ``BUSY_WAIT_S``."""
        deadline = time.monotonic() + BUSY_WAIT_S
        while True:
            try:
                response = self.client.request(method, self.url + path, json=body)
            except httpx.TransportError as exc:
                raise ConnectionError(
                    f"no codepost sample-server answers at {self.url} ({exc}); start one with "
                    "`codepost sample-server`, or drop engine.server_url to sample in-process"
                ) from exc
            retry_after = response.headers.get("Retry-After", "")
            busy = response.status_code == 503 and retry_after.isdigit()
            if not busy or time.monotonic() + int(retry_after) > deadline:
                break
            time.sleep(int(retry_after))
        if response.status_code == 409:
            raise WeightSyncError(f"{self.url}: {response.json()['detail']}")
        if response.is_error:
            raise RuntimeError(
                f"codepost sample-server {self.url}{path}: {response.status_code} "
                f"{response.text[:500]}"
            )
        return response.json()


def check_server(url: str) -> None:
    """Raise, naming ``url``, unless a sample server answers there and takes our token."""
    RemoteSampler(url, token=os.environ.get(TOKEN_ENV)).close()
