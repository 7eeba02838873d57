"""What costly requests do to codepost's servers: the server process's peak memory, and how
long ``GET /health`` waits while the server reads them.

Each case runs on a fresh server, so the peak (``VmHWM``) is the case's own. On
``codepost verify-server`` (one container):

* ``lcb-packed``: an inline LiveCodeBench record whose packed private tests (base64 of zlib of
  a pickled JSON string) are a few hundred KB and inflate to ``--inflated-mb``;
* ``check-960k``: an inline HumanEval-style problem whose test module is 960 kB of asserts;
* ``check-six``: six different 864 kB test modules, one request after another (the memory the
  server keeps after each);
* ``check-worst``: the costliest test module the server accepts (``--max-problem-code-chars``
  characters of ``a;a;a...``: the most syntax-tree nodes per character), then its verdict.

On ``codepost sample-server`` (SmolLM2 on transformers):

* ``sample-plain``: one greedy prompt of 8 tokens (the first request pages the weights in);
* ``sample-stops``: the same with 16 stop strings of 128 characters;
* ``sample-bodies``: 4 bodies of 15 MB at once, each 65,536 prompts of 22 empty fields: read
  and parsed (about 20 times their size in objects), then refused for their number (413).

A thread asks ``/health`` every 20 ms meanwhile; the line of each answer gives its status, its
time, the slowest ``/health`` and the memory.

    .venv/bin/python benchmarks/server_bounds.py [--inflated-mb 600] [--cases lcb-packed,...]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import pickle
import struct
import tempfile
import threading
import time
import zlib
from pathlib import Path

import httpx
from verify_server import server

SAMPLE = {"task_id": "big", "completion": "    return x\n"}


def packed_tests(inflated_bytes: int) -> str:
    """LiveCodeBench's packing of one stdin test whose input is ``inflated_bytes`` of ``a``,
    built in chunks (the pickle of a JSON string: BINUNICODE8, its length, its bytes)."""
    head, tail = b'[{"input": "', b'", "output": "1", "testtype": "stdin"}]'
    size = len(head) + inflated_bytes + len(tail)
    packer = zlib.compressobj(9)
    parts = [packer.compress(b"\x80\x04\x8d" + struct.pack("<Q", size) + head)]
    chunk = b"a" * (1 << 20)
    for start in range(0, inflated_bytes, len(chunk)):
        parts.append(packer.compress(chunk[: inflated_bytes - start]))
    parts.append(packer.compress(tail + pickle.STOP) + packer.flush())
    return base64.b64encode(b"".join(parts)).decode()


def lcb_record(inflated_bytes: int) -> dict:
    return {
        "question_id": "big",
        "question_content": "Print 1.",
        "public_test_cases": "[]",
        "private_test_cases": packed_tests(inflated_bytes),
        "metadata": "{}",
    }


def check_record(task_id: str, test: str) -> dict:
    return {"task_id": task_id, "prompt": "def f(x):\n", "entry_point": "f", "test": test}


def asserts_module(size: int, salt: int = 0) -> str:
    line = f"    assert candidate({salt}) == {salt}\n"
    return "def check(candidate):\n" + line * (size // len(line))


def worst_module(chars: int) -> str:
    head = "def check(candidate):\n    assert candidate(1) == 1\n    "
    return head + "a;" * ((chars - len(head) - 1) // 2) + "\n"


def memory(pid: int) -> dict[str, int]:
    """The process's resident and peak resident memory, in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {key: int(fields[key].split()[0]) >> 10 for key in ("VmRSS", "VmHWM")}


def sample_bodies(count: int) -> list[dict]:
    prompt = {f"f{i}": "" for i in range(22)}
    return [{"prompts": [prompt] * 65536, "sampling": {"max_tokens": 8}}] * count


def watched(url: str, pid: int, path: str, bodies: list[dict], at_once: bool) -> list[str]:
    """Send ``bodies`` to ``path`` (one after another, or ``at_once``) while a thread times
    /health; a line per body."""
    slowest = [0.0]
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(timeout=120) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.get(f"{url}/health")
                slowest[0] = max(slowest[0], time.perf_counter() - started)
                time.sleep(0.02)

    start = memory(pid)
    watcher = threading.Thread(target=watch)
    watcher.start()

    def send(body: dict) -> str:
        with httpx.Client(timeout=600) as client:
            if not at_once:
                slowest[0] = 0.0
            started = time.perf_counter()
            answer = client.post(f"{url}{path}", json=body)
            took = time.perf_counter() - started
        time.sleep(0.3)  # a last /health after the answer
        now = memory(pid)
        return (
            f"{answer.status_code} in {took:.2f} s, /health at most {slowest[0]:.3f} s, "
            f"RSS {start['VmRSS']} -> {now['VmRSS']} MiB, peak {now['VmHWM']} MiB; "
            f"{answer.text[:160]}"
        )

    try:
        if at_once:
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as threads:
                lines = list(threads.map(send, bodies))
        else:
            lines = [send(body) for body in bodies]
    finally:
        done.set()
        watcher.join()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inflated-mb", type=int, default=600)
    parser.add_argument("--max-problem-code-chars", type=int, default=32 << 10)
    parser.add_argument(
        "--cases",
        default="lcb-packed,check-960k,check-six,check-worst,sample-plain,sample-stops,"
        "sample-bodies",
    )
    args = parser.parse_args()
    cases = {
        "lcb-packed": lambda: [
            {"samples": [SAMPLE], "problems": [lcb_record(args.inflated_mb << 20)]}
        ],
        "check-960k": lambda: [
            {"samples": [SAMPLE], "problems": [check_record("big", asserts_module(960_000))]}
        ],
        "check-six": lambda: [
            {"samples": [SAMPLE], "problems": [check_record("big", asserts_module(864_000, i))]}
            for i in range(6)
        ],
        "check-worst": lambda: [
            {
                "samples": [SAMPLE],
                "problems": [check_record("big", worst_module(args.max_problem_code_chars))],
            }
        ],
    }
    greedy = {"num_generations": 1, "temperature": 0, "max_tokens": 8}
    stops = [chr(ord("A") + i) * 128 for i in range(16)]
    prompt = {"task_id": "p", "text": "def f():", "completion_style": "continuation"}
    samples = {
        "sample-plain": lambda: [{"prompts": [prompt], "sampling": greedy}],
        "sample-stops": lambda: [{"prompts": [prompt], "sampling": {**greedy, "stop": stops}}],
        "sample-bodies": lambda: sample_bodies(4),
    }
    verify_options = (
        "--workers",
        "1",
        "--max-problem-code-chars",
        str(args.max_problem_code_chars),
    )
    sample_options = ("--engine.backend", "hf")
    with tempfile.TemporaryDirectory() as work:
        for name in args.cases.split(","):
            on_sampler = name in samples
            bodies = (samples if on_sampler else cases)[name]()
            size = sum(len(str(body)) for body in bodies) >> 10
            started = server(
                *(sample_options if on_sampler else verify_options),
                log=Path(work) / f"{name}.log",
                command="sample-server" if on_sampler else "verify-server",
            )
            with started as (url, process):
                path = "/sample" if on_sampler else "/verify"
                lines = watched(url, process.pid, path, bodies, at_once=name == "sample-bodies")
                for index, line in enumerate(lines):
                    print(f"{name}[{index}] ({size} KiB sent): {line}", flush=True)


if __name__ == "__main__":
    main()
