"""Nothing crosses jobs: each kind of attacker's test code (``tests/judge_attacks.py``) runs in
the judge through ``POST /verify``, then another caller's wrong and right samples on the same
container (a server of one worker) are judged as they would be on a fresh one, in their usual
time, and the container is kept."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import docker
import httpx
import pytest
import servers
from judge_attacks import HONEST, JUDGE_ATTACKS, NEEDS_CPU, WRONG, WRONG_MBPP, JudgeAttack
from servers import Server

pytestmark = pytest.mark.docker

VICTIM_STATUSES = ["failed", "syntax_error", "failed", "failed"] + ["passed"] * (len(HONEST) + 1)
VICTIM_S = 15.0  # eight samples on one container: about 1.5 s when nothing interferes


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> Iterator[Server]:
    with servers.running_server(
        "verify-server", tmp_path_factory.mktemp("isolation"), "--workers", "1"
    ) as server:
        yield server


def verify(server: Server, body: dict) -> tuple[list[dict], float]:
    started = time.monotonic()
    response = httpx.post(f"{server.url}/verify", json=body, timeout=300)
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    return response.json()["verdicts"], took


def containers(server: Server) -> list[str]:
    label = f"codepost.owner={socket.gethostname()}:{server.process.pid}"
    return [c.id for c in docker.from_env().containers.list(filters={"label": label})]


@pytest.mark.parametrize("attack", JUDGE_ATTACKS, ids=[attack.id for attack in JUDGE_ATTACKS])
def test_an_attackers_test_code_reaches_no_later_verdict(one_worker, attack: JudgeAttack):
    before = containers(one_worker)
    (own,), attack_took = verify(
        one_worker, {"samples": [attack.sample], "problems": [attack.problem], "timeout": 2}
    )
    victims, took = verify(one_worker, {"samples": [*WRONG, *HONEST, NEEDS_CPU], "timeout": 2})
    mbpp, _ = verify(one_worker, {"samples": WRONG_MBPP, "problems": "mbpp", "timeout": 2})
    statuses = [verdict["status"] for verdict in victims]
    print(
        f"{attack.id}: attacker {own['status']} in {attack_took:.1f} s; victims {statuses} in "
        f"{took:.1f} s; MBPP/2 wrong: {mbpp[0]['status']}"
    )
    assert statuses == VICTIM_STATUSES, [v["result"] for v in victims]
    assert mbpp[0]["status"] == "failed", mbpp[0]["result"]
    assert took < VICTIM_S, took
    assert containers(one_worker) == before  # cleaned up, not replaced
