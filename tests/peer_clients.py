"""Other projects' sandbox clients, run as their trainers run them: each at its own default
concurrency and deadline, against a ``verify-server`` URL. Each workload sends correct and wrong
programs whose every case sleeps, so that the queue's wait, not the machine's speed, decides
whether a deadline is reached, and tallies what the client concluded: correct, wrong or
api_error (the client gave up on the server)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

CASE_S = 1.5  # what each case of a workload's programs sleeps
CORRECT = f"import time\nn = int(input())\ntime.sleep({CASE_S})\nprint(n * n)"
WRONG = CORRECT.replace("n * n", "n + n")


def square_cases(count: int) -> dict[str, list[str]]:
    """``count`` stdin/stdout cases of squaring, none where adding gives the same (2)."""
    numbers = range(3, 3 + count)
    return {"inputs": [f"{n}\n" for n in numbers], "outputs": [f"{n * n}\n" for n in numbers]}


@contextlib.contextmanager
def bare_packages(root: Path, *names: str) -> Iterator[None]:
    """``names`` (a package and its subpackages under ``root``) registered without running their
    ``__init__``, so that one module of a project installed with ``--no-deps`` imports from its
    own files, unchanged, without the parents' heavy imports (verl's: ray, torch, tensordict)."""
    saved = {name: sys.modules.get(name) for name in names}
    for name in names:
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def verl_sandbox_fusion() -> Iterator[types.ModuleType]:
    """``verl.utils.reward_score.sandbox_fusion`` as verl 0.9.1 ships it (scripts/setup.sh
    installs verl with ``--no-deps``)."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None, "verl is not installed"
    module = "verl.utils.reward_score.sandbox_fusion"
    with bare_packages(Path(spec.origin).parent, "verl", "verl.utils", "verl.utils.reward_score"):
        sys.modules.pop(module, None)
        sys.modules.pop(f"{module}.utils", None)
        yield importlib.import_module(module)


def verl_workload(url: str, programs: list[str], cases: int) -> Counter[str]:
    """verl's reward loop at its defaults: every sample's ``compute_score`` at once (its reward
    workers run them in the event loop's default executor), one semaphore of
    ``reward.sandbox_fusion.max_concurrent`` = 64 over all their requests, verl's default time-out
    (10 s, so a 30 s deadline per request) and memory (1024 MB). Counts the cases by outcome."""
    tally: Counter[str] = Counter()
    with verl_sandbox_fusion() as sandbox_fusion:
        semaphore = threading.Semaphore(64)
        with concurrent.futures.ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4)) as pool:
            scored = [
                pool.submit(
                    sandbox_fusion.compute_score,
                    f"{url}/run_code",
                    semaphore,
                    1024,
                    f"```python\n{program}\n```",
                    square_cases(cases),
                )
                for program in programs
            ]
            for future in scored:
                _, metadata = future.result()
                tally.update(verl_outcome(entry) for entry in metadata)
    return tally


def verl_outcome(entry: dict[str, Any]) -> str:
    if entry["status"] == "success":
        return "correct"
    if entry["status"] == "wrong_answer":
        return "wrong"
    return entry["status"]  # api_error, and anything else a test should name


def sandbox_fusion_workload(url: str, programs: list[str], cases: int) -> Counter[str]:
    """The ``sandbox-fusion`` package's client at its defaults: ``run_concurrent``'s 20 threads,
    ``run_code``'s 5 attempts and no client time-out. A case is correct when the run succeeded
    and printed the expected line."""
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code, run_concurrent

    expected = square_cases(cases)
    jobs = [
        (program, stdin, output)
        for program in programs
        for stdin, output in zip(expected["inputs"], expected["outputs"], strict=True)
    ]
    requests = [
        {"request": RunCodeRequest(code=program, language="python", stdin=stdin)}
        for program, stdin, _ in jobs
    ]

    def attempt(request: RunCodeRequest) -> Any:
        try:
            return run_code(request, endpoint=url)
        except Exception as exc:  # what the client raises when it gives up
            return exc

    tally: Counter[str] = Counter()
    for (_, _, output), answer in zip(jobs, run_concurrent(attempt, kwargs=requests), strict=True):
        if isinstance(answer, Exception):
            tally["api_error"] += 1
        elif answer.status == RunStatus.Success and answer.run_result.stdout == output:
            tally["correct"] += 1
        else:
            tally["wrong"] += 1
    return tally


def tinker_harness(cases: int) -> str:
    """A program in the shape of tinker-cookbook's ``code_rl`` grader: it runs the candidate
    (``code.py``) on each case of ``test_cases.txt`` and exits 0 only when every answer is right
    (the recipe's own harness imports numpy, which the sandbox image does not ship)."""
    return (
        "import json, subprocess, sys\n"
        "tests = json.load(open('test_cases.txt'))\n"
        "for stdin, expected in zip(tests['inputs'], tests['outputs']):\n"
        "    run = subprocess.run([sys.executable, 'code.py'], input=stdin, text=True,\n"
        "                         capture_output=True, timeout=6)\n"
        "    if run.stdout != expected:\n"
        "        sys.exit(1)\n"
    )


@contextlib.contextmanager
def tinker_sandbox_fusion() -> Iterator[types.ModuleType]:
    """``tinker_cookbook.sandbox.sandboxfusion`` as tinker-cookbook 0.6.1 ships it (scripts/setup.sh
    installs it with ``--no-deps``: the client needs aiohttp alone, its parents chz and more)."""
    spec = importlib.util.find_spec("tinker_cookbook")
    assert spec is not None and spec.origin is not None, "tinker-cookbook is not installed"
    module = "tinker_cookbook.sandbox.sandboxfusion"
    with bare_packages(Path(spec.origin).parent, "tinker_cookbook", "tinker_cookbook.sandbox"):
        sys.modules.pop(module, None)
        yield importlib.import_module(module)


def tinker_workload(url: str, programs: list[str], cases: int) -> Counter[str]:
    """tinker-cookbook's ``SandboxFusionClient`` at its defaults (``SANDBOX_MAX_CONCURRENCY``
    4 connections, a 6000 s session time-out, no retries), one request per program with its
    cases as files and the ``code_rl`` recipe's time-out ((6 + 1) s a case + 5 s). Counts
    programs: correct when the client says it succeeded, api_error when it got no answer (an
    HTTP error or none)."""

    async def grade(client_type: Any) -> list[tuple[bool, dict[str, Any]]]:
        client = client_type(url=f"{url}/run_code")
        try:
            return await asyncio.gather(
                *(
                    client.run(
                        code=tinker_harness(cases),
                        files={"test_cases.txt": json.dumps(square_cases(cases)), "code.py": p},
                        timeout=(6 + 1) * cases + 5,
                    )
                    for p in programs
                )
            )
        finally:
            await client.close()

    tally: Counter[str] = Counter()
    with tinker_sandbox_fusion() as sandboxfusion:
        graded = asyncio.run(grade(sandboxfusion.SandboxFusionClient))
    for success, answer in graded:
        tally["api_error" if "error" in answer else "correct" if success else "wrong"] += 1
    return tally


def trl_verify_reward(url: str) -> Callable[..., list[float]]:
    """The TRL recipe's reward function (docs/verifier-service.md): a batch of completions to
    ``/verify`` as samples of MBPP, sent again after Retry-After while the server is busy."""

    def test_reward(completions: list[Any], task_id: list[str], **kwargs: Any) -> list[float]:
        samples = [
            {"task_id": t, "completion": c} for t, c in zip(task_id, completions, strict=True)
        ]
        body = {"samples": samples, "problems": "mbpp"}
        while True:
            answer = httpx.post(f"{url}/verify", json=body, timeout=None)
            if answer.status_code != 429:
                break
            time.sleep(float(answer.headers["Retry-After"]))
        answer.raise_for_status()
        return [verdict["reward"] for verdict in answer.json()["verdicts"]]

    return test_reward
