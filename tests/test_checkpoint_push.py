"""``codepost checkpoints push``: a published checkpoint to a hub model repository with its
card, through huggingface_hub's own client, its HTTP (httpx2, huggingface_hub's client library)
answered here, with no network: the requests it makes are what the hub would get. A hub out of
reach, refused or switched off is one line, naming the repo."""

from __future__ import annotations

import base64
import json

import httpx2
import pytest
from endpoints import closed_port_url
from huggingface_hub.utils import _http
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.flows.cli import main
from codepost.pipeline.checkpoints.hub import HubError, push_to_hub
from codepost.pipeline.checkpoints.manifest import (
    CARD,
    STATE,
    CheckpointManifest,
    publish,
    write_model,
)


class FakeHub:
    """The hub's side of a push: a repo made, the card's metadata validated, the files'
    upload modes asked, one commit."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.created: list[dict] = []
        self.validated: list[str] = []
        self.committed: dict[str, bytes] = {}
        self.message = ""

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if self.status != 200:
            return httpx2.Response(self.status, json={"error": "Invalid credentials"})
        path = request.url.path
        if path == "/api/repos/create":
            self.created.append(json.loads(request.content))
            return httpx2.Response(200, json={"url": "https://huggingface.co/me/tiny"})
        if path == "/api/validate-yaml":  # a card's metadata, checked before the commit
            self.validated.append(json.loads(request.content)["content"])
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:  # every file inline (no LFS): their bytes are in the commit
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                     for f in files]  # fmt: skip
            return httpx2.Response(200, json={"files": modes})
        if "/commit/" in path:
            for line in request.content.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    self.message = item["value"]["summary"]
                elif item["key"] == "file":
                    self.committed[item["value"]["path"]] = base64.b64decode(
                        item["value"]["content"]
                    )
            commit = {"commitUrl": "https://huggingface.co/me/tiny/commit/1", "commitOid": "1" * 40}
            return httpx2.Response(200, json=commit)
        return httpx2.Response(404, json={"error": f"{path}: not here"})


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub's HTTP client answered by a :class:`FakeHub`."""
    fake = FakeHub()
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(fake)))
    yield fake
    _http.set_client_factory(_http.default_client_factory)


@pytest.fixture
def checkpoint(tmp_path):
    """A published RL iteration: weights, tokenizer, card, manifest and a trainer state."""
    tokenizer = char_tokenizer("abc")

    def write(folder):
        write_model(folder, tiny_causal_lm(len(tokenizer)), tokenizer)
        (folder / STATE).mkdir()
        (folder / STATE / "tensors.safetensors").write_bytes(b"optimizer moments")

    target = tmp_path / "run" / "rl" / "iteration-0002"
    publish(target, write, CheckpointManifest(stage="rl-grpo", version="iteration-0002"))
    return target


def test_a_checkpoint_is_pushed_with_its_card_and_manifest_not_its_trainer_state(
    hub, checkpoint, capsys
):
    root = checkpoint.parents[1]
    assert main(["checkpoints", "--root", str(root), "push", "rl-grpo/iteration-0002", "me/tiny",
                 "--private"]) == 0  # fmt: skip
    assert "rl-grpo/iteration-0002 -> me/tiny: https://huggingface.co/me/tiny/commit/1" in (
        capsys.readouterr().out
    )
    assert [(c["name"], c["organization"], c["visibility"]) for c in hub.created] == [
        ("tiny", "me", "private")
    ]
    assert hub.message == "codepost: rl-grpo/iteration-0002"
    uploaded = set(hub.committed)
    assert {CARD, "manifest.json", "config.json", "model.safetensors", "tokenizer.json"} <= uploaded
    assert not any(name.startswith(f"{STATE}/") for name in uploaded)
    assert hub.committed[CARD] == (checkpoint / CARD).read_bytes()
    assert hub.validated == [(checkpoint / CARD).read_text()]
    assert hub.committed["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()


def test_a_push_the_hub_refuses_or_cannot_take_is_one_line(hub, checkpoint, monkeypatch, capsys):
    hub.status = 401
    with pytest.raises(HubError, match=r"^cannot push to me/tiny on .*: no write access for this "
                                       r"login \(HF_TOKEN"):  # fmt: skip
        push_to_hub(checkpoint, "me/tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = checkpoint.parents[1]
    assert main(["checkpoints", "--root", str(root), "push", "rl-grpo/iteration-0002",
                 "me/tiny"]) == 1  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot push to me/tiny on https://huggingface.co: HF_HUB_OFFLINE is set" in err


def test_a_checkpoint_that_no_longer_matches_its_manifest_is_not_pushed(hub, checkpoint):
    (checkpoint / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"config\.json: sha256 differs"):
        push_to_hub(checkpoint, "me/tiny")
    assert hub.created == []


def test_a_hub_out_of_reach_is_named(checkpoint, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", url := closed_port_url())
    with pytest.raises(HubError, match=rf"^cannot push to me/tiny on {url}: no answer"):
        push_to_hub(checkpoint, "me/tiny")
