"""The sample server's bounds on hostile callers, fast: its app over a fake engine in this
process (``tests/test_sample_server.py`` runs the real server on vLLM and transformers)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import huggingface_hub
import pytest
import torch
from safetensors.torch import save_file
from tiny_models import char_tokenizer
from transformers.generation.stopping_criteria import STOP_STRING_EMBEDDING_CACHE

from codepost.flows.cli import build_parser
from codepost.pipeline.inference import remote
from codepost.pipeline.inference.generate import StopStrings, stopped_lengths
from codepost.pipeline.inference.remote import TOKEN_ENV
from codepost.pipeline.inference.sampling import (
    EngineConfig,
    HFSampler,
    VLLMSampler,
    WeightSyncError,
    start_tensors,
)
from codepost.pipeline.inference.server import SampleServerConfig, create_app
from codepost.pipeline.model_config import ModelConfig

PROMPT = {"task_id": "a", "text": "def f():", "completion_style": "continuation"}
SAMPLE = {"prompts": [PROMPT], "sampling": {"max_tokens": 4}}
GOOD = {"Authorization": "Bearer s3cret"}


class FakeEngine:
    """A sampler that records what reaches it, and fails as it is told."""

    name = "fake"

    tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens: text.split())

    def __init__(self) -> None:
        self.weights = "start"
        self.calls: list[tuple[str, Any]] = []
        self.raises: Exception | None = None
        self.died: str | None = None

    def sample(self, prompts, config, *, policy_version=0):
        self.calls.append(("sample", [p.task_id for p in prompts]))
        if self.raises is not None:
            raise self.raises
        return [{"prompt_id": p.task_id} for p in prompts]

    def refresh(self, checkpoint: Path, expected_probe=None) -> float:
        self.calls.append(("refresh", str(checkpoint)))
        if self.raises is not None:
            raise self.raises
        self.weights = str(checkpoint)
        return math.nan

    def probe_logprobs(self) -> list[float]:
        return [-1.0]

    def failure(self) -> str | None:
        return self.died


def answers(config: SampleServerConfig, engine: FakeEngine, *calls: tuple[str, str, dict]):
    """The answers to ``calls`` (method, path, keyword arguments), sent one after another."""
    app = create_app(config, engine)

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return [await client.request(m, path, **options) for m, path, options in calls]

    return asyncio.run(send())


def test_the_token_is_checked_before_the_body_is_read():
    app = create_app(SampleServerConfig(token="s3cret"), FakeEngine())
    sent: list[dict] = []

    async def receive() -> dict:
        raise AssertionError("the body of a request without the token was read")

    async def send(message: dict) -> None:
        sent.append(message)

    for authorization in (b"", b"Bearer wrong", "Bearer s3crét".encode()):
        sent.clear()
        scope = {
            "type": "http", "method": "POST", "path": "/sample", "raw_path": b"/sample",
            "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
            "server": ("server", 80), "client": ("client", 1),
            "headers": [(b"content-length", b"40000000"), (b"authorization", authorization)],
        }  # fmt: skip
        asyncio.run(app(scope, receive, send))
        assert sent[0]["status"] == 401, sent


def test_bodies_prompts_and_stop_strings_are_bounded():
    config = SampleServerConfig(max_body_bytes=64 << 10, max_prompts=3, max_completions=16)
    engine = FakeEngine()

    async def chunks():  # no Content-Length: cut off as the limit is passed
        for _ in range(100):
            yield b" " * 1024

    def sampling(**fields: Any) -> dict:
        return {"json": {**SAMPLE, "sampling": {"max_tokens": 4, **fields}}}

    too_long = {**PROMPT, "text": "x " * 2048}  # 2048 tokens, a context of 2048

    huge, chunked, prompts, long_prompt, many, long, empty, fine, work, tokens = answers(
        config,
        engine,
        ("POST", "/sample", {"content": b" " * (65 << 10)}),
        ("POST", "/sample", {"content": chunks()}),
        ("POST", "/sample", {"json": {**SAMPLE, "prompts": SAMPLE["prompts"] * 4}}),
        ("POST", "/sample", {"json": {**SAMPLE, "prompts": [PROMPT, too_long]}}),
        ("POST", "/sample", sampling(stop=["x"] * 17)),
        ("POST", "/sample", sampling(stop=["ok", "y" * 129])),
        ("POST", "/sample", sampling(stop=[""])),
        ("POST", "/sample", sampling(stop=["\n\n"] * 16)),
        ("POST", "/sample", sampling(num_generations=17)),
        ("POST", "/sample", sampling(max_tokens=config.engine.max_model_len + 1)),
    )
    assert huge.status_code == chunked.status_code == 413, (huge.text, chunked.text)
    assert "over the server's limit of 65536 bytes" in chunked.json()["detail"]
    assert prompts.status_code == 413 and "max_prompts 3" in prompts.json()["detail"]
    assert long_prompt.status_code == 400, long_prompt.text
    assert "prompts[1]: 2048 tokens, no room" in long_prompt.json()["detail"]
    assert many.status_code == 422 and "sampling.stop: 17 strings" in many.json()["detail"]
    assert long.status_code == 422 and "sampling.stop[1]: 129 characters" in long.text
    assert empty.status_code == 422 and "sampling.stop[0]: 0 characters" in empty.text
    assert fine.status_code == 200, fine.text
    assert work.status_code == 413 and "17 completions" in work.json()["detail"]
    assert tokens.status_code == 422 and "sampling.max_tokens" in tokens.json()["detail"]
    assert engine.calls == [("sample", ["a"])]  # only the request within bounds reached it


def test_a_body_sent_too_slowly_gets_408():
    app = create_app(SampleServerConfig(body_timeout_s=0.2), FakeEngine())
    sent: list[dict] = []
    parts = [{"type": "http.request", "body": b'{"prompts": [', "more_body": True}]

    async def receive() -> dict:
        if parts:
            return parts.pop()
        await asyncio.sleep(60)  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/sample", "raw_path": b"/sample",
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "server": ("server", 80), "client": ("client", 1), "headers": [],
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    assert sent[0]["status"] == 408
    assert b"not received whole within the server's 0.2 s" in sent[1]["body"]


def test_refresh_reads_only_under_the_checkpoint_root(tmp_path):
    root, outside = tmp_path / "runs", tmp_path / "elsewhere"
    for folder in (root / "ok", root / "leaky", outside / "model"):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (root / "linked").symlink_to(outside / "model")
    (root / "leaky" / "model.safetensors").symlink_to(outside / "model" / "config.json")
    (root / "looped").mkdir()
    (root / "looped" / "config.json").write_text("{}")
    (root / "looped" / "model.safetensors").symlink_to(root / "looped" / "model.safetensors")
    engine = FakeEngine()
    config = SampleServerConfig(checkpoint_root=root)

    def refresh(path: Path | str) -> dict:
        return {"json": {"checkpoint": str(path)}}

    unrooted, *refused, nul, loop, missing, ok = answers(
        SampleServerConfig(), engine, ("POST", "/refresh", refresh(root / "ok"))
    ) + answers(
        config,
        engine,
        ("POST", "/refresh", refresh(outside / "model")),
        ("POST", "/refresh", refresh(outside / "nothing")),
        ("POST", "/refresh", refresh(root / ".." / "elsewhere" / "model")),
        ("POST", "/refresh", refresh(root / "linked")),
        ("POST", "/refresh", refresh(root / "leaky")),
        ("POST", "/refresh", refresh("/etc")),
        ("POST", "/refresh", refresh(f"{root}/ok\0")),
        ("POST", "/refresh", refresh(root / "looped")),
        ("POST", "/refresh", refresh(root / "nothing")),
        ("POST", "/refresh", refresh(root / "ok")),
    )
    assert unrooted.status_code == 403 and "--checkpoint-root" in unrooted.json()["detail"]
    assert [r.status_code for r in refused] == [403] * 6, [r.text for r in refused]
    # outside the root, whether a model folder exists there is not told
    assert refused[0].json()["detail"].replace("model", "nothing") == refused[1].json()["detail"]
    assert "links to a file outside" in refused[4].json()["detail"]
    assert nul.status_code == 422 and "checkpoint:" in nul.json()["detail"]
    assert loop.status_code == 422 and "checkpoint:" in loop.json()["detail"]  # was a bare 500
    assert missing.status_code == 404
    assert ok.status_code == 200, ok.text
    assert engine.calls == [("refresh", str(root / "ok"))]


def test_engine_errors_answer_4xx_and_a_dead_engine_is_unhealthy(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    refresh = {"json": {"checkpoint": str(tmp_path / "model")}}
    config = SampleServerConfig(checkpoint_root=tmp_path)
    engine = FakeEngine()
    engine.raises = ValueError("The decoder prompt (length 9000) is longer than the maximum")
    (refused,) = answers(config, engine, ("POST", "/sample", {"json": SAMPLE}))
    assert refused.status_code == 400 and "longer than the maximum" in refused.json()["detail"]

    engine.raises = WeightSyncError("weights do not fit the model: nothing was loaded")
    fits_not, healthy = answers(
        config, engine, ("POST", "/refresh", refresh), ("GET", "/health", {})
    )
    assert fits_not.status_code == 409 and healthy.json() == {"status": "ok"}

    engine.raises = OSError("[Errno 5] Input/output error")  # mid-load: the weights are unknown
    broken, health, sample, probe = answers(
        config, engine,
        ("POST", "/refresh", refresh), ("GET", "/health", {}),
        ("POST", "/sample", {"json": SAMPLE}), ("GET", "/probe", {}),
    )  # fmt: skip
    assert broken.status_code == 409 and "the served weights are unknown" in broken.text
    assert health.status_code == sample.status_code == probe.status_code == 503
    assert health.json() == {"status": "unhealthy"}  # open to all: it says nothing more
    assert "the engine can no longer serve: a refresh from" in sample.json()["detail"]
    assert "Input/output error" in probe.json()["detail"]

    app = create_app(config, engine)  # one app: the state carries from call to call
    engine.raises = OSError("[Errno 5] Input/output error")

    async def recovered() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            codes = [(await client.post("/refresh", **refresh)).status_code]
            codes.append((await client.get("/health")).status_code)
            engine.raises = None  # a good checkpoint: known weights again
            codes.append((await client.post("/refresh", **refresh)).status_code)
            codes.append((await client.get("/health")).status_code)
            engine.died = "vLLM's engine core died"
            codes.append((await client.get("/health")).status_code)
            codes.append((await client.post("/refresh", **refresh)).status_code)
            return codes

    assert asyncio.run(recovered()) == [409, 503, 200, 200, 503, 503]


@pytest.mark.parametrize("token", ["", "s3crét", "two words"])
def test_a_token_that_no_client_can_send_is_refused_at_start(token, monkeypatch, capsys):
    with pytest.raises(ValueError, match="printable ASCII"):
        SampleServerConfig(token=token)
    monkeypatch.setenv(TOKEN_ENV, token)  # set, even empty: the server must not start open
    args = build_parser("sample-server").parse_args(["sample-server"])
    assert args.func(args) == 2
    assert "printable ASCII" in capsys.readouterr().err


def test_validation_answers_stay_small():
    wrong_items = {"prompts": [{"task_id": 0}] * 1000, "sampling": {}}
    too_many = {"prompts": [0] * 500_000, "sampling": {}}
    started = time.monotonic()
    wrong, many = answers(
        SampleServerConfig(),
        FakeEngine(),
        ("POST", "/sample", {"json": wrong_items}),
        ("POST", "/sample", {"json": too_many}),
    )
    assert time.monotonic() - started < 5  # 200,000 wrong items alone took 6 s, then 70 kB
    assert wrong.status_code == 422 and len(wrong.content) < 4000
    assert json.loads(wrong.content)["detail"].endswith("and 990 more errors")
    assert many.status_code == 422 and "at most 65536 items" in many.json()["detail"]


class HeldEngine(FakeEngine):
    """Samples only once ``release`` is set: its request holds its body meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def sample(self, prompts, config, *, policy_version=0):
        self.started.set()
        self.release.wait(30)
        return super().sample(prompts, config, policy_version=policy_version)


def test_bodies_past_the_budget_get_503_with_retry_after_at_once():
    config = SampleServerConfig(max_body_bytes=64 << 10, max_pending_bytes=64 << 10)
    engine = HeldEngine()
    app = create_app(config, engine)
    big = {**SAMPLE, "prompts": [{**PROMPT, "task_id": "b" * 40_000}]}  # 40 kB, 3 tokens

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            first = asyncio.create_task(client.post("/sample", json=big))
            while not engine.started.is_set():
                await asyncio.sleep(0.01)
            refused = await client.post("/sample", json=big)  # 80 kB held: over 64 KiB
            small = asyncio.create_task(client.post("/sample", json=SAMPLE))  # fits: waits
            await asyncio.sleep(0.1)
            engine.release.set()
            return [await first, refused, await small, await client.post("/sample", json=big)]

    first, refused, small, again = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    assert (
        refused.json()["detail"].startswith("server busy: ")
        and "bytes of requests held" in refused.text
    )
    assert [first.status_code, small.status_code, again.status_code] == [200] * 3
    assert [call for call, _ in engine.calls] == ["sample"] * 3  # the refused one never reached it


def test_the_client_asks_a_busy_server_again_when_it_says(monkeypatch):
    script: list[tuple[int, dict]] = []
    sent: list[str] = []
    slept: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/engine":
            return httpx.Response(200, json={"sampler": "fake", "weights": "start"})
        status, headers = script.pop(0) if script else (200, {})
        return httpx.Response(status, headers=headers, json={"detail": "no", "logprobs": [-1.0]})

    client = httpx.Client
    monkeypatch.setattr(
        remote.httpx,
        "Client",
        lambda **options: client(transport=httpx.MockTransport(handler), **options),
    )
    monkeypatch.setattr(remote.time, "sleep", slept.append)
    sampler = remote.RemoteSampler("http://server")
    script[:] = [(503, {"Retry-After": "2"})] * 2  # its budget full: it says when to come back
    assert sampler.probe_logprobs() == [-1.0]
    script[:] = [(503, {})]  # an engine that can no longer serve: said at once
    with pytest.raises(RuntimeError, match=r"/probe: 503"):
        sampler.probe_logprobs()
    assert slept == [2, 2] and sent.count("/probe") == 4


def test_stop_strings_end_each_row_at_the_token_that_completes_one():
    tokenizer = char_tokenizer("abcxyz ")
    prompt = tokenizer.encode("zz", add_special_tokens=False)  # a stop in the prompt: not read
    texts = ("ab cxz", "xyzzya", "aaaaaa")
    rows = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    stops = ["b c", "zz"]
    criteria = StopStrings(tokenizer, stops, len(prompt))
    ended: list[int | None] = [None] * len(rows)
    for step in range(1, 7):  # as generate asks: once a token, the prompt first
        done = criteria(torch.tensor([prompt + row[:step] for row in rows]), None)
        ended = [e or (step if d else None) for e, d in zip(ended, done.tolist(), strict=True)]
    lengths, stopped = stopped_lengths(tokenizer, torch.tensor(rows), stops)
    assert ended == [4, 4, None]  # "b c" across three tokens; "zz"; none in "aaaaaa"
    assert ended == [
        n if s else None for n, s in zip(lengths.tolist(), stopped.tolist(), strict=True)
    ]


@pytest.mark.slow  # SmolLM2 on transformers
def test_long_stop_strings_cost_the_hf_backend_no_pass_over_its_vocabulary():
    model = ModelConfig()  # SmolLM2-135M: 49,152 tokens
    sampler = HFSampler(model.resolve(), model, EngineConfig(backend="hf"))
    greedy = {"num_generations": 1, "temperature": 0, "max_tokens": 8}
    (plain,) = answers(
        SampleServerConfig(), sampler, ("POST", "/sample", {"json": {**SAMPLE, "sampling": greedy}})
    )
    text = plain.json()["rows"][0]["completion"]
    stop = text[2:5]  # where the greedy completion ends with it as a stop string
    stops = [chr(ord("A") + i) * 128 for i in range(15)] + [stop]
    tracemalloc.start()
    try:
        (stopped,) = answers(
            SampleServerConfig(),
            sampler,
            ("POST", "/sample", {"json": {**SAMPLE, "sampling": {**greedy, "stop": stops}}}),
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stopped.status_code == 200, stopped.text
    (row,) = stopped.json()["rows"]
    assert row["finish_reason"] == "stop" and row["completion"] == text[: text.find(stop) + 3]
    # transformers' own stop strings built a table of every token against every stop (16 of
    # 128 characters: 69 s and 372 MB) and kept the last 8 tables
    assert not STOP_STRING_EMBEDDING_CACHE
    assert peak < 64 << 20, peak


def test_an_engine_started_from_a_hub_id_checks_each_refresh_against_its_snapshot(
    tmp_path, monkeypatch
):
    cache, revision = tmp_path / "hub", "0" * 40
    snapshot = cache / "models--owner--tiny" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (cache / "models--owner--tiny" / "refs").mkdir()
    (cache / "models--owner--tiny" / "refs" / "main").write_text(revision)
    save_file({"w": torch.zeros(2, 3)}, snapshot / "model.safetensors")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert start_tensors("owner/tiny") == {"w": ((2, 3), "F32")}  # as vLLM downloaded it
    assert start_tensors("owner/elsewhere") == {}
    runs = tmp_path / "runs"
    for name, shape in (("fits", (2, 3)), ("reshaped", (3, 2))):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.json").write_text("{}")
        save_file({"w": torch.ones(shape)}, runs / name / "model.safetensors")
    loaded: list[tuple] = []
    engine = SimpleNamespace(  # vLLM's LLM, as far as a refresh reaches it
        collective_rpc=lambda method, args: loaded.append(args),
        reset_prefix_cache=lambda: None,
        llm_engine=SimpleNamespace(engine_core=SimpleNamespace()),
    )
    served = {
        name: (shape, torch.float32) for name, (shape, _) in start_tensors("owner/tiny").items()
    }
    hub, unknown = VLLMSampler.__new__(VLLMSampler), VLLMSampler.__new__(VLLMSampler)
    hub.__dict__.update(llm=engine, weights="owner/tiny", served=served)
    unknown.__dict__.update(llm=engine, weights="owner/elsewhere", served={})
    config = SampleServerConfig(checkpoint_root=runs)

    def refresh(name: str) -> tuple[str, str, dict]:
        return "POST", "/refresh", {"json": {"checkpoint": str(runs / name)}}

    reshaped, fits = answers(config, hub, refresh("reshaped"), refresh("fits"))
    (refused,) = answers(config, unknown, refresh("fits"))
    # an engine started from a hub id skipped the check, and loaded what did not fit
    assert reshaped.status_code == 409 and "other shapes [('w', (3, 2), (2, 3))]" in reshaped.text
    assert fits.status_code == 200, fits.text
    assert (
        refused.status_code == 409 and "whose safetensors are not on this machine" in refused.text
    )
    assert loaded == [(str(runs / "fits"),)]  # only the checkpoint that fits was loaded
