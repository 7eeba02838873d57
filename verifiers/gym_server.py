"""``codepost gym-server``: codepost's verdicts behind NeMo-Gym's resource-server contract for
code, the one its ``code_gen`` server keeps: ``POST /seed_session``, and ``POST /verify``, whose
request carries the policy's answer (``response``, an OpenAI Responses object) and
``verifier_metadata.unit_tests`` (LiveCodeBench's ``inputs``, ``outputs`` and ``fn_name``, plain
or ``packed``: base64 of zlib of their JSON), and whose answer is the request with ``reward``
(1.0 when every test passes) and the fields ``code_gen`` adds.

``code_gen`` runs the program in a process of its own, without a sandbox. An agent pointed at
this server instead has its rollouts judged in codepost's: each answer is a LiveCodeBench
problem read within the inline-problem bounds of every pool server (its size, its unpacked
tests, its test count), its code taken from a fenced block (an answer without one scores 0,
as there), and run in the warm pool. A final answer holding ``<think>`` tags, or reasoning with
more than one of either, scores ``reasoning_format_penalty``, as there.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import functools
import json
import time
import zlib
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from ..sandbox import Limits, SandboxPool
from ..settings.command_line import server_command
from .extraction import build_program, find_code_blocks, strip_think
from .options import TOKEN_ENV
from .rewards import RewardConfig
from .server.admission import Admission
from .server.app import pool_app
from .server.command import serve_pool
from .server.config import PoolServerConfig
from .server.verify import (
    UNPACKED_PER_PROBLEM_BYTE,
    check_test_counts,
    named_or_inline,
    within_caps,
)
from .serving import JSONAnswer
from .verifier import Verifier

THINK_TAGS = ("<think>", "</think>")


class GymServerConfig(PoolServerConfig):
    """``gym-server``'s: its pool, the work it holds at once, and how it scores."""

    port: int = Field(8002, ge=0, le=65535, description="TCP port")
    max_pending: int = Field(
        256, ge=1, description="answers accepted and not scored yet; past it, 429 at once"
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="wall and CPU seconds per test (code_gen's unit_test_timeout_secs), held to "
        "max_timeout_s",
    )
    memory_mb: int = Field(512, ge=16, description="memory per program, held to max_memory_mb")
    reasoning_format_penalty: float = Field(
        0.0, description="the reward of an answer that breaks the reasoning format (code_gen's)"
    )


class GymVerifyRequest(BaseModel):
    """NeMo-Gym's verify request: every field it sends is kept and sent back."""

    model_config = ConfigDict(extra="allow")

    response: dict[str, Any]
    verifier_metadata: dict[str, Any] | None = None


def output_text(response: dict[str, Any]) -> str:
    """The final answer of a Responses object, as its ``output_text`` reads it: the text of
    every ``output_text`` part of every message."""
    return "".join(
        part.get("text") or ""
        for item in response.get("output") or []
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def breaks_reasoning_format(response: dict[str, Any], answer: str) -> bool:
    """``<think>`` tags in the final answer, or more than one of either in the reasoning."""
    reasoning = "".join(
        summary.get("text") or ""
        for item in response.get("output") or []
        if isinstance(item, dict) and item.get("type") == "reasoning"
        for summary in item.get("summary") or []
        if isinstance(summary, dict)
    )
    return any(tag in answer or reasoning.count(tag) > 1 for tag in THINK_TAGS)


def unit_tests(metadata: dict[str, Any] | None, unpacked_bytes: int) -> dict[str, Any]:
    """``verifier_metadata.unit_tests``, unpacked within ``unpacked_bytes``; 422 naming what is
    missing or malformed, 413 past the bound."""
    tests = (metadata or {}).get("unit_tests")
    if not isinstance(tests, dict):
        raise HTTPException(422, "verifier_metadata.unit_tests: expected an object")
    if "packed" in tests:
        inflater = zlib.decompressobj()
        try:
            text = inflater.decompress(
                base64.b64decode(tests["packed"], validate=True), unpacked_bytes
            )
        except (binascii.Error, zlib.error, TypeError, ValueError) as exc:
            raise HTTPException(422, f"verifier_metadata.unit_tests.packed: {exc}") from None
        if inflater.unconsumed_tail:
            raise HTTPException(
                413, f"verifier_metadata.unit_tests.packed unpacks past {unpacked_bytes} bytes"
            )
        try:
            unpacked = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise HTTPException(422, f"verifier_metadata.unit_tests.packed: {exc}") from None
        if not isinstance(unpacked, dict):
            raise HTTPException(422, "verifier_metadata.unit_tests.packed: expected an object")
        tests = {**unpacked, "fn_name": tests.get("fn_name")}
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs)):
        raise HTTPException(
            422, "verifier_metadata.unit_tests: inputs and outputs, one each a test"
        )
    return tests


def livecodebench_record(tests: dict[str, Any]) -> dict[str, Any]:
    """The tests as a LiveCodeBench record (functional where ``fn_name`` names the function)."""
    kind = "functional" if tests.get("fn_name") else "stdin"
    cases = [
        {"input": given, "output": expected, "testtype": kind}
        for given, expected in zip(tests["inputs"], tests["outputs"], strict=True)
    ]
    return {
        "question_id": "nemo-gym",
        "question_content": "",
        "public_test_cases": "[]",
        "private_test_cases": json.dumps(cases),
        "metadata": json.dumps({"func_name": tests["fn_name"]} if tests.get("fn_name") else {}),
    }


def create_app(config: GymServerConfig, pool: SandboxPool) -> FastAPI:
    """The server's app over a started ``pool``, which stays the caller's to close."""
    admission = Admission(config.max_pending, config.retry_after_s, config.max_pending_bytes)
    app = pool_app(
        "codepost gym-server",
        "codepost's verdicts behind NeMo-Gym's code resource server: /seed_session, /verify",
        config,
        admission.bodies,
    )
    app.state.admission = admission
    limits = Limits(
        wall_time_s=min(config.timeout_s, config.max_timeout_s),
        cpu_time_s=min(config.timeout_s, config.max_timeout_s),
        memory_mb=min(config.memory_mb, config.max_memory_mb),
        job_time_s=config.max_job_s,
    )
    verifier = Verifier(
        pool,
        limits=limits,
        reward_config=RewardConfig(sandbox_errors="fail"),
        completion_style="chat",
    )

    @app.post("/seed_session")
    async def seed_session() -> JSONAnswer:
        return JSONAnswer({})  # code_gen keeps no state between calls

    @app.post("/verify")
    async def verify(request: GymVerifyRequest) -> JSONAnswer:
        answer = output_text(request.response)
        echoed = request.model_dump()
        if not answer.strip():
            return JSONAnswer({**echoed, "reward": 0.0})
        unpacked = UNPACKED_PER_PROBLEM_BYTE * config.max_problem_bytes
        tests = unit_tests(request.verifier_metadata, unpacked)
        problems = await asyncio.to_thread(
            lambda: within_caps(named_or_inline([livecodebench_record(tests)], config), config)
        )
        check_test_counts(problems, config, "send fewer tests")
        (problem,) = problems.values()
        if not any(block.closed for block in find_code_blocks(strip_think(answer))):
            return JSONAnswer({**echoed, "reward": 0.0, "extracted_model_output": answer})
        sample = {"task_id": problem.task_id, "completion": answer}
        started = time.monotonic()
        with admission.admit(1):
            (verdict,) = await verifier.averify(problems, [sample])
        broken = breaks_reasoning_format(request.response, answer)
        reward = config.reasoning_format_penalty if broken else float(verdict.passed)
        return JSONAnswer(
            {
                **echoed,
                "reward": reward,
                "extracted_model_output": answer,
                "extracted_model_code": build_program(problem, answer, "chat").source,
                "result": [test.passed for test in verdict.tests],
                "metadata": {"status": verdict.status.value, "result": verdict.result},
                "unit_tests_time_taken": time.monotonic() - started,
                "reasoning_format_violation_rate": float(broken),
            }
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "workers": config.workers,
            "max_pending": config.max_pending,
            "pending": admission.pending,
        }

    return app


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``gym-server`` subcommand to a ``codepost``-style subparsers object."""
    return server_command(
        subparsers,
        "gym-server",
        GymServerConfig,
        serve,
        TOKEN_ENV,
        example="--port 8002 --workers 4 --timeout-s 10",
        help="serve codepost's verdicts as NeMo-Gym's code resource server",
        description=(
            "Serve the warm sandbox pool behind NeMo-Gym's resource-server contract for code "
            "(its code_gen server's): POST /seed_session, POST /verify (the policy's Responses "
            "object and LiveCodeBench unit tests in, the reward out), GET /health. Binds to "
            f"127.0.0.1 unless --host says otherwise; the bearer token is ${TOKEN_ENV} unless "
            "--token gives one."
        ),
    )


def serve(config: GymServerConfig) -> int:
    return serve_pool(
        "gym-server",
        config,
        functools.partial(create_app, config),
        f"up to {config.max_pending} answers pending",
        lambda app: f"{app.state.admission.accepted} answers accepted",
    )
