"""``codepost sample-server`` for real: a vLLM engine in its own process on 127.0.0.1, used by
the stages through ``engine.server_url``; its weights refreshed from checkpoint folders and
checked with the trainer's probe, as for an engine in the trainer's process."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
import torch
from engines import ROLLOUT_KEYS, TEST_ENGINE, perturbed_copy, recomputed_logprobs, saved_tiny_model
from servers import free_port, running_server
from stage_helpers import small_rl_config

from codepost.pipeline.data.prompts import Prompt
from codepost.pipeline.data.rows import Context
from codepost.pipeline.inference.engines import close_samplers, get_sampler
from codepost.pipeline.inference.remote import TOKEN_ENV, RemoteSampler
from codepost.pipeline.inference.sampling import (
    EngineConfig,
    SamplingConfig,
    WeightSyncError,
    trainer_probe_logprobs,
)
from codepost.pipeline.model_config import load_causal_lm
from codepost.pipeline.stages.rl import METRICS_FILE, iteration_dir, run_rl

PROMPTS = [Prompt("a", "def f(x):", "continuation"), Prompt("b", "return x +", "continuation")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("model") / "tiny", hidden_size=128)


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory):
    """A vLLM sample-server on the tiny model, configured from a YAML file."""
    folder = tmp_path_factory.mktemp("sample-server")
    config = folder / "server.yaml"
    settings = {
        "model": tiny.model_dump(),
        "engine": TEST_ENGINE.model_dump(),
        "checkpoint_root": str(tmp_path_factory.getbasetemp()),  # every test's tmp_path
    }
    config.write_text(json.dumps(settings))
    with running_server("sample-server", folder, "--config", str(config)) as server:
        yield server
    close_samplers(server.url)  # this process's client of it; its own engines keep running


@pytest.mark.slow
def test_a_served_engine_samples_and_serves_new_weights_that_the_probe_checks(
    served, tiny, tmp_path
):
    engine = EngineConfig(server_url=served.url)
    sampler = get_sampler(tiny, engine)
    assert isinstance(sampler, RemoteSampler) and sampler.name.startswith("vllm-")
    assert get_sampler(tiny, engine) is sampler  # one client per server

    rows = sampler.sample(
        PROMPTS, SamplingConfig(num_generations=3, max_tokens=8), policy_version=2
    )
    assert len(rows) == 6 and set(rows[0]) == ROLLOUT_KEYS
    assert rows[0]["sampler"].startswith("vllm-") and rows[0]["policy_version"] == 2
    policy = load_causal_lm(tiny)
    for row in rows:  # the served engine's logprobs are the trainer's
        torch.testing.assert_close(
            torch.tensor(row["sampling_logprobs"]), recomputed_logprobs(policy, row, 1.0),
            atol=1e-3, rtol=0,
        )  # fmt: skip

    # an episode's next turn: completions of a context given as token ids
    context = Context(rows[0]["prompt_ids"] + rows[0]["completion_ids"], ())
    (group,) = sampler.complete([context], SamplingConfig(num_generations=2, max_tokens=4))
    assert len(group) == 2 and all(len(c.token_ids) == len(c.logprobs) > 0 for c in group)

    moved = perturbed_copy(tiny, tmp_path / "moved", scale=0.05)
    moved_model = load_causal_lm(tiny.model_copy(update={"name_or_path": str(moved)}))
    probe = trainer_probe_logprobs(moved_model, moved_model.config.vocab_size)
    with pytest.raises(WeightSyncError, match="did not take"):  # it still serves `tiny`
        sampler.refresh(moved, [p + 1.0 for p in probe])
    assert sampler.refresh(moved, probe) < 1e-4
    assert httpx.get(f"{served.url}/engine").json()["weights"] == str(moved)
    # Back to the model itself, through the stages' own door: a new checkpoint is served.
    assert get_sampler(tiny, engine, checkpoint=tiny.name_or_path).weights == tiny.name_or_path

    with pytest.raises(RuntimeError, match=r"no model folder here .* shared, at the same path"):
        sampler.refresh(tmp_path / "nowhere")
    long_prompt = {"task_id": "a", "text": "x " * 1100, "completion_style": "continuation"}
    refused = httpx.post(
        f"{served.url}/sample", json={"prompts": [long_prompt], "sampling": {"max_tokens": 4}}
    )  # the caller's error, refused before vLLM sees it; the engine serves on
    assert refused.status_code == 400 and "no room for a completion" in refused.text
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}


@pytest.mark.slow
@pytest.mark.docker
def test_rl_samples_on_a_served_engine_refreshed_after_every_update(served, tiny, tmp_path):
    config = small_rl_config(tiny, EngineConfig(server_url=served.url))
    out = tmp_path / "run"
    run_rl(config, out)
    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    for key in ("sampler/refresh_probe_diff", "sampler/logprob_diff/mean"):
        print(f"\nserved engine, {key}: {[r[key] for r in rows]}")
    assert all(r["sampler/refresh_probe_diff"] < 1e-4 for r in rows)  # the server took them
    assert all(r["sampler/logprob_diff/mean"] < 1e-3 for r in rows)
    assert httpx.get(f"{served.url}/engine").json()["weights"] == str(iteration_dir(out, 2))


def test_closing_a_served_engines_client_leaves_the_other_engines_running(tiny, monkeypatch):
    from codepost.pipeline.inference import engines

    closed: list[str | None] = []

    def started(checkpoint, model, engine):
        return SimpleNamespace(weights=checkpoint, close=lambda: closed.append(engine.server_url))

    monkeypatch.setattr(engines, "_start_sampler", started)
    monkeypatch.setattr(engines, "_SAMPLERS", {})
    local = get_sampler(tiny, EngineConfig(backend="hf"))
    served = get_sampler(tiny, EngineConfig(server_url="http://127.0.0.1:1"))
    close_samplers("http://127.0.0.1:1")
    assert closed == ["http://127.0.0.1:1"]
    assert get_sampler(tiny, EngineConfig(backend="hf")) is local
    assert get_sampler(tiny, EngineConfig(server_url="http://127.0.0.1:1")) is not served


def test_a_missing_server_is_named():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=f"no codepost sample-server answers at {url}"):
        RemoteSampler(url)


@pytest.mark.slow
def test_a_token_guards_every_endpoint(tiny, tmp_path, monkeypatch):
    with running_server(
        "sample-server", tmp_path, "--model.name-or-path", tiny.name_or_path,
        "--engine.backend", "hf",
        env={TOKEN_ENV: "s3cret"},
    ) as guarded:  # fmt: skip
        assert httpx.get(f"{guarded.url}/engine").status_code == 401
        assert httpx.post(f"{guarded.url}/refresh", json={"checkpoint": "/"}).status_code == 401
        assert RemoteSampler(guarded.url, token="s3cret").probe_logprobs()
        monkeypatch.setenv(TOKEN_ENV, "s3cret")  # what the stages send
        engine = EngineConfig(server_url=guarded.url)
        rows = get_sampler(tiny, engine).sample(
            PROMPTS, SamplingConfig(num_generations=1, max_tokens=4)
        )
        assert [row["prompt_id"] for row in rows] == ["a", "b"]
        close_samplers(guarded.url)
