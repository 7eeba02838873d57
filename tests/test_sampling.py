"""Group sampling: rows of the rollouts contract, sampling logprobs equal to the trainer's,
weights refreshed in place and checked (vLLM on the CPU with the real SmolLM2; transformers
``generate`` with a tiny model)."""

from __future__ import annotations

import logging
import os
import tempfile
from types import SimpleNamespace

import psutil
import pytest
import torch
from engines import (
    ROLLOUT_KEYS,
    TEST_ENGINE,
    changed_copy,
    one_tensor_copy,
    perturbed_copy,
    recomputed_logprobs,
)
from tiny_models import char_tokenizer, tiny_causal_lm

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import Prompt, build_prompt
from codepost.pipeline.data.rows import Completion, Context, rollout_rows
from codepost.pipeline.inference.engines import get_sampler
from codepost.pipeline.inference.generate import cut_after_stop, generate_rollouts, stopped_lengths
from codepost.pipeline.inference.sampling import (
    EngineConfig,
    HFSampler,
    SamplingConfig,
    WeightSyncError,
    check_free_memory,
    check_probe,
    full_disk_named,
    reserved_cores,
    trainer_probe_logprobs,
)
from codepost.pipeline.model_config import ModelConfig, load_causal_lm, load_tokenizer
from codepost.pipeline.rl.batches import collate_rollouts


def test_too_little_memory_for_the_kv_cache_is_said_before_vllm_starts(monkeypatch):
    check_free_memory(0)  # this machine has a GiB to spare
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**30))
    with pytest.raises(MemoryError, match=r"1\.0 GiB available, it needs 2 GiB .*cpu_kv_cache_gib"):
        check_free_memory(2)


def test_an_engine_start_on_a_full_disk_names_the_folder(monkeypatch, tmp_path):
    """It said only "RuntimeError: Engine core initialization failed" (the red team's case)."""
    import errno
    import shutil

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    real = shutil.disk_usage

    def full_tmp(path):
        usage = real(path)
        return usage._replace(free=10 << 20) if str(path) == str(tmp_path) else usage

    failed = RuntimeError("Engine core initialization failed. See root cause above.")
    with pytest.raises(RuntimeError, match="Engine core"), full_disk_named():
        raise failed  # room everywhere: vLLM's own error
    monkeypatch.setattr(shutil, "disk_usage", full_tmp)
    with pytest.raises(OSError, match=rf"{tmp_path}: 10 MiB free") as caught, full_disk_named():
        raise failed
    assert caught.value.errno == errno.ENOSPC and caught.value.__cause__ is failed


@pytest.mark.parametrize(("cores", "threads", "reserved"),
                         [(1, None, 0), (2, None, 0), (2, 1, 1), (8, None, 1), (8, 4, 4)])  # fmt: skip
def test_the_engine_computes_on_every_core_of_a_small_machine_and_keeps_one_on_a_large(
    monkeypatch, cores, threads, reserved
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    assert reserved_cores(threads) == reserved


def test_check_probe_fails_loudly_past_the_tolerance():
    assert check_probe([-1.0, -2.0], [-1.0, -2.001], 1e-2) == pytest.approx(5e-4)
    with pytest.raises(WeightSyncError, match="did not take"):
        check_probe([-1.0, -2.0], [-1.5, -2.0], 1e-2)
    with pytest.raises(WeightSyncError, match="did not take"):
        check_probe([float("nan")], [-1.0], 1e-2)


@pytest.fixture
def tiny_checkpoints(tmp_path):
    """Two tiny models of one architecture, saved as folders with their tokenizer."""
    tokenizer = char_tokenizer("def():\n rtun0123456789+", pad_is_eos=True)
    paths = []
    for seed in (0, 1):
        path = tmp_path / f"tiny-{seed}"
        tiny_causal_lm(len(tokenizer), seed=seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


def test_hf_sampler_rows_and_refresh(tiny_checkpoints):
    first, second = tiny_checkpoints
    sampler = HFSampler(
        str(first), ModelConfig(name_or_path=str(first)), EngineConfig(backend="hf")
    )
    prompts = [Prompt("a", "def f():", "continuation"), Prompt("b", "return ", "continuation")]
    rows = sampler.sample(prompts, SamplingConfig(num_generations=3, max_tokens=8, temperature=0.7))
    assert len(rows) == 6 and set(rows[0]) == ROLLOUT_KEYS
    assert [(r["prompt_id"], r["group_index"]) for r in rows][:3] == [("a", 0), ("a", 1), ("a", 2)]
    assert {r["temperature"] for r in rows} == {0.7} and rows[0]["sampler"] == "hf-generate"
    for row in rows:
        expected = recomputed_logprobs(sampler.model, row, 0.7)
        torch.testing.assert_close(
            torch.tensor(row["sampling_logprobs"]), expected, atol=1e-4, rtol=0
        )

    target = load_causal_lm(ModelConfig(name_or_path=str(second)))
    other_probe = trainer_probe_logprobs(target, target.config.vocab_size)
    with pytest.raises(WeightSyncError):  # the engine still serves `first`
        check_probe(sampler.probe_logprobs(), other_probe, 1e-4)
    assert sampler.refresh(second, other_probe) < 1e-5
    assert sampler.weights == str(second)


def test_each_context_stops_at_its_own_stop_strings_on_the_hf_backend(tiny_checkpoints):
    """One generate call stops at every stop string it is given: contexts that differ in
    theirs must not share one (a context without stops came back cut at another's)."""
    first, _ = tiny_checkpoints
    sampler = HFSampler(
        str(first), ModelConfig(name_or_path=str(first)), EngineConfig(backend="hf")
    )
    ids = sampler.tokenizer.encode("def f():", add_special_tokens=False)
    greedy = SamplingConfig(num_generations=1, max_tokens=12, temperature=0)
    ((plain,),) = sampler.complete([Context(ids, ())], greedy)
    stop = plain.text[2:4]
    assert len(plain.token_ids) == 12 and len(stop) == 2, plain
    (unstopped,), (stopped,) = sampler.complete([Context(ids, ()), Context(ids, (stop,))], greedy)
    assert unstopped.text == plain.text and unstopped.finish_reason == "length"
    assert (
        stopped.finish_reason == "stop" and stopped.text == plain.text[: plain.text.index(stop) + 2]
    )


def test_a_refused_refresh_leaves_the_served_weights_as_they_were(
    tiny_checkpoints, tmp_path, caplog
):
    first, second = tiny_checkpoints
    sampler = HFSampler(
        str(first), ModelConfig(name_or_path=str(first)), EngineConfig(backend="hf")
    )
    before = sampler.probe_logprobs()
    other_size = tmp_path / "wider"
    tiny_causal_lm(sampler.model.config.vocab_size, hidden_size=32).save_pretrained(other_size)
    for misfit in (one_tensor_copy(second, tmp_path / "one-tensor"), other_size):
        with pytest.raises(WeightSyncError, match="do not fit the model"):
            sampler.refresh(misfit)
        assert sampler.probe_logprobs() == before  # not one tensor copied
        assert sampler.weights == str(first)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "model.safetensors")  # opened, it would wait for a writer for good
    with pytest.raises(WeightSyncError, match="not a regular file"):
        sampler.refresh(fifo)
    integers = changed_copy(
        second, tmp_path / "integers", lambda ts: {n: t.to(torch.int32) for n, t in ts.items()}
    )
    with pytest.raises(WeightSyncError, match=r"not floating point \[\('.*', 'I32', 'torch"):
        sampler.refresh(integers)
    cut = changed_copy(second, tmp_path / "cut", lambda ts: ts)
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:12])
    with pytest.raises(WeightSyncError, match=r"unreadable .* nothing was loaded"):
        sampler.refresh(cut)
    assert sampler.probe_logprobs() == before and sampler.weights == str(first)
    halves = changed_copy(
        second, tmp_path / "bf16", lambda ts: {n: t.to(torch.bfloat16) for n, t in ts.items()}
    )
    with caplog.at_level(logging.WARNING):
        sampler.refresh(halves)  # floats of another precision: cast, and said
    assert "bf16: cast on load, BF16 -> float32" in caplog.text
    assert sampler.model.dtype == torch.float32 and sampler.weights == str(halves)


@torch.no_grad()
def nucleus_logprobs(model: torch.nn.Module, row: dict, temperature: float, top_p: float):
    """Reference: the completion tokens' logprobs under top-p of ``softmax(logits / T)``, the
    nucleus of vLLM and ``generate`` (the least likely tokens are dropped while their total
    mass is <= 1 - top_p), renormalised; from one unpadded forward of the row."""
    prompt, completion = row["prompt_ids"], row["completion_ids"]
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    probs = (logits.float() / temperature).softmax(-1)
    ascending, order = probs.sort(-1)
    dropped = torch.zeros_like(probs, dtype=torch.bool)
    dropped.scatter_(-1, order, ascending.cumsum(-1) <= 1 - top_p)
    tokens = torch.tensor(completion)[:, None]
    assert not dropped.gather(-1, tokens).any(), "a sampled token lies outside the nucleus"
    kept_mass = probs.masked_fill(dropped, 0).sum(-1)
    return probs.gather(-1, tokens).squeeze(-1).log() - kept_mass.log()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_generated_logprobs_are_those_of_the_distribution_sampled_from(temperature, top_p):
    """Greedy rows (temperature 0) report the model's own distribution, as vLLM does."""
    tokenizer = char_tokenizer("def():\n rtun0123456789+", pad_is_eos=True)
    model = tiny_causal_lm(len(tokenizer))
    prompts = [Prompt("a", "def f():\n return ", "continuation"), Prompt("b", "1+", "continuation")]
    # 3 samples per prompt, 30 tokens per scoring forward: 2 rows in each, some with both
    # prompts (left padding).
    rows = generate_rollouts(
        model, tokenizer, prompts, num_generations=3, max_new_tokens=12,
        temperature=temperature, top_p=top_p, seed=0, tokens_per_forward=30,
    )  # fmt: skip
    assert len(rows) == 6
    logprobs = torch.cat([torch.tensor(r["sampling_logprobs"]) for r in rows])
    expected = torch.cat([nucleus_logprobs(model, r, temperature or 1.0, top_p) for r in rows])
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    plain = torch.cat([recomputed_logprobs(model, r, temperature or 1.0) for r in rows])
    if top_p == 1:  # the trainer's recomputation, logits / temperature
        torch.testing.assert_close(logprobs, plain, atol=1e-5, rtol=0)
    else:  # the nucleus renormalises: its tokens are likelier than under the temperature alone
        assert (logprobs > plain + 1e-3).any()


def test_hf_sampler_requests_no_generation_scores(tiny_checkpoints, monkeypatch):
    checkpoint = str(tiny_checkpoints[0])
    sampler = HFSampler(
        checkpoint, ModelConfig(name_or_path=checkpoint), EngineConfig(backend="hf")
    )
    calls = []
    generate = sampler.model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        output = generate(*args, **kwargs)
        assert isinstance(output, torch.Tensor)  # token ids, no per-step score tensors
        return output

    monkeypatch.setattr(sampler.model, "generate", spy)
    sampler.sample(
        [Prompt("a", "def f():", "continuation")], SamplingConfig(num_generations=2, max_tokens=6)
    )
    (kwargs,) = calls
    assert not kwargs.get("output_scores") and not kwargs.get("output_logits")
    assert kwargs["return_dict_in_generate"] is False


@pytest.fixture(scope="module")
def smollm2():
    return ModelConfig(), load_tokenizer(ModelConfig())


@pytest.fixture(scope="module")
def chat_prompts(smollm2):
    _, tokenizer = smollm2
    problems = load_problem_set(ProblemSet(limit=2))
    return [build_prompt(problem, tokenizer) for problem in problems.values()]


def test_a_chat_completion_stops_at_its_closing_fence_and_one_without_a_fence_runs_on(
    smollm2, chat_prompts
):
    _, tokenizer = smollm2
    (prompt, *_) = chat_prompts
    answer = "def f(x):\n    return x\n```\n\nThis function returns x."
    unfenced = "def f(x):\n    return x\n\nThis function returns x, with no fence at all."
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in (answer, unfenced)]
    width = max(map(len, ids)) + 1  # each row ends with EOS
    generated = torch.tensor([row + [tokenizer.eos_token_id] * (width - len(row)) for row in ids])
    lengths, stopped = stopped_lengths(tokenizer, generated, prompt.stop)
    assert stopped.tolist() == [True, True]
    # Through the fence's own token, not the prose after it; the other through its EOS.
    assert tokenizer.decode(ids[0][: lengths[0]]).endswith("return x\n```")
    assert lengths[1] == len(ids[1]) + 1
    assert stopped_lengths(tokenizer, generated[:, :5], prompt.stop)[1].tolist() == [False] * 2
    text = cut_after_stop(
        tokenizer.decode(ids[0][: lengths[0]] + ids[0][lengths[0] :][:1]), prompt.stop
    )
    (row,) = rollout_rows(
        prompt,
        tokenizer.encode(prompt.model_input, add_special_tokens=False),
        [Completion(text, ids[0][: lengths[0]], [0.0] * int(lengths[0]), "stop")],
        temperature=0, top_p=1, max_tokens=8, sampler="s", sampler_weights="w", policy_version=0,
    )  # fmt: skip
    # The verifier reads one whole fenced block; prompt + completion is the sequence sampled.
    assert row["completion"] == "```python\ndef f(x):\n    return x\n```"
    assert tokenizer.decode(row["prompt_ids"]).endswith("assistant\n```python\n")


@pytest.mark.slow
def test_vllm_rows_follow_the_contract_with_the_trainers_logprobs(smollm2, chat_prompts):
    model_config, tokenizer = smollm2
    sampler = get_sampler(model_config, TEST_ENGINE, checkpoint=model_config.resolve())
    config = SamplingConfig(num_generations=3, max_tokens=24, temperature=0.7, seed=1)
    rows = sampler.sample(chat_prompts, config, policy_version=4)
    assert len(rows) == 6 and set(rows[0]) == ROLLOUT_KEYS
    assert rows[0]["sampler"].startswith("vllm-") and rows[0]["policy_version"] == 4
    assert [r["group_index"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert rows[0]["prompt_ids"] == tokenizer.encode(
        chat_prompts[0].model_input, add_special_tokens=False
    )
    model = load_causal_lm(model_config)
    diffs = torch.cat(
        [
            (torch.tensor(r["sampling_logprobs"]) - recomputed_logprobs(model, r, 0.7)).abs()
            for r in rows
        ]
    )
    assert len(diffs) == sum(len(r["completion_ids"]) for r in rows)
    assert diffs.mean() < 1e-3 and diffs.max() < 2e-2  # logprobs after temperature, as trained
    batch = collate_rollouts([{**r, "reward": 0.0} for r in rows], pad_token_id=0)
    assert batch.temperatures.tolist() == pytest.approx([0.7] * 6)
    assert get_sampler(model_config, TEST_ENGINE) is sampler  # one engine per process
    # The engine's processes run on tcmalloc, as vLLM's CPU guide asks (set-up installs it).
    engine_processes = [c for c in psutil.Process().children(recursive=True)
                        if "VLLM::" in " ".join(c.cmdline())]  # fmt: skip
    assert engine_processes
    assert all(any("libtcmalloc" in m.path for m in c.memory_maps()) for c in engine_processes), [
        c.cmdline() for c in engine_processes
    ]

    # Greedy, the chat answer opened with the fence: HumanEval/0's code closes within the
    # budget and ends at the fence, HumanEval/1's does not (cut at max_tokens, inside the code).
    greedy = SamplingConfig(num_generations=1, temperature=0, max_tokens=128)
    closed, cut = sampler.sample(chat_prompts, greedy)
    assert closed["completion"].startswith("```python\ndef has_close_elements(")
    assert closed["completion"].endswith("\n```") and closed["finish_reason"] == "stop"
    assert tokenizer.decode(closed["completion_ids"][-1:]) == "```"  # no token after the fence
    assert cut["finish_reason"] == "length" and "\n```" not in cut["completion"]


@pytest.mark.slow
def test_vllm_serves_new_weights_in_place_and_a_refresh_that_did_not_take_fails(
    smollm2, chat_prompts, tmp_path
):
    model_config, _ = smollm2
    base = model_config.resolve()
    sampler = get_sampler(model_config, TEST_ENGINE, checkpoint=base)
    new = perturbed_copy(model_config, tmp_path / "new", scale=0.02)
    new_model = load_causal_lm(ModelConfig(name_or_path=str(new)))
    new_probe = trainer_probe_logprobs(new_model, new_model.config.vocab_size)
    old_probe = sampler.probe_logprobs()
    with pytest.raises(WeightSyncError, match="did not take"):  # different weights
        check_probe(old_probe, new_probe, TEST_ENGINE.probe_tolerance)

    assert sampler.refresh(new, new_probe) < TEST_ENGINE.probe_tolerance
    assert get_sampler(model_config, TEST_ENGINE, checkpoint=str(new)) is sampler  # no restart
    assert os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "3600"  # a slow CPU step is no crash
    rows = sampler.sample(chat_prompts[:1], SamplingConfig(num_generations=2, max_tokens=16))
    for row in rows:
        expected = recomputed_logprobs(new_model, row, 1.0)
        assert (torch.tensor(row["sampling_logprobs"]) - expected).abs().mean() < 1e-3

    with pytest.raises(WeightSyncError, match="did not take"):
        sampler.refresh(new, old_probe)  # the trainer says one thing, the engine serves another
    with pytest.raises(WeightSyncError, match="do not fit the model"):  # and no probe to catch it
        sampler.refresh(one_tensor_copy(new, tmp_path / "one-tensor"))
    assert sampler.probe_logprobs() == pytest.approx(new_probe, abs=TEST_ENGINE.probe_tolerance)
    sampler.refresh(base, old_probe)  # and back


def test_a_refresh_quiets_only_the_layers_no_checkpoint_holds():
    """vLLM's own reload logger, with a handler of the test's: rotary embeddings and a tied LM
    head are quiet during a refresh; an untied head and any other layer still warn."""
    from vllm.model_executor.model_loader.reload import layerwise

    from codepost.pipeline.inference.vllm_worker import expected_unloaded_quiet

    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    layerwise.logger.addHandler(handler)
    # An engine started earlier in this process set vLLM's level from VLLM_LOGGING_LEVEL, which
    # importing TRL makes ERROR: the warnings would not be made at all, filtered or not.
    level = layerwise.logger.level
    layerwise.logger.setLevel(logging.WARNING)
    try:
        for tied in (True, False):
            with expected_unloaded_quiet(tied_lm_head=tied):
                for layer in ("RotaryEmbedding", "ParallelLMHead", "QKVParallelLinear"):
                    layerwise.logger.warning("%s: Failed to load weights", layer)
        layerwise.logger.warning("%s: Failed to load weights", "RotaryEmbedding")  # outside one
    finally:
        layerwise.logger.setLevel(level)
        layerwise.logger.removeHandler(handler)
    assert heard == [
        "QKVParallelLinear: Failed to load weights",
        "ParallelLMHead: Failed to load weights",
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: Failed to load weights",
    ]
