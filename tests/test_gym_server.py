"""``codepost gym-server`` for real: NeMo-Gym's resource-server contract for code (its
``code_gen`` server's ``/seed_session`` and ``/verify``), each request shaped as NeMo-Gym's
agents send it (a Responses object, LiveCodeBench unit tests, plain or packed), against a
2-worker server. NeMo-Gym itself does not install here (it needs Python 3.13), so the requests
are built as its ``CompCodingVerifyRequest`` dumps them."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator

import httpx
import pytest
from servers import Server, running_server

pytestmark = pytest.mark.docker

SQUARE_TESTS = {"inputs": ["2\n", "5\n"], "outputs": ["4", "25"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with running_server("gym-server", tmp_path_factory.mktemp("gym"), "--workers", "2") as running:
        yield running


def request(answer: str, tests: dict, reasoning: str | None = None) -> dict:
    """A verify request as NeMo-Gym's agent sends it: the Responses object of the policy."""
    output: list[dict] = []
    if reasoning is not None:
        output.append(
            {
                "id": "rs",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    output.append(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
        }
    )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Read n, print n^2."}]},
        "response": {
            "id": "resp",
            "object": "response",
            "created_at": 0.0,
            "model": "policy",
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        },
        "verifier_metadata": {"unit_tests": tests, "difficulty": "easy"},
    }


def verify(server: Server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/verify", json=body, timeout=60)


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        ("Here:\n```python\nn = int(input())\nprint(n * n)\n```", 1.0),
        ("```python\nn = int(input())\nprint(n + 1)\n```", 0.0),  # wrong answer
        ("n = int(input())\nprint(n * n)", 0.0),  # no fenced block: no code, as code_gen
        ("```python\nprint('hello'\n```", 0.0),  # syntax error
        ("```python\nn = int(input())\nprint(n / 0)\n```", 0.0),  # runtime error
        ("```python\nimport sys\nsys.exit(0)\n```", 0.0),  # exits 0 without answering
        ("```python\nn = int(input())\nprint(n * n)\n```\n<think>x</think>", 0.0),  # format
    ],
    ids=["right", "wrong", "unfenced", "syntax", "runtime", "exit-0", "think-in-answer"],
)
def test_verify_scores_as_code_gen_does_and_echoes_the_request(server, answer, reward):
    body = request(answer, SQUARE_TESTS)
    answered = verify(server, body)
    assert answered.status_code == 200, answered.text
    scored = answered.json()
    assert scored["reward"] == reward, scored
    for field in ("responses_create_params", "response", "verifier_metadata"):
        assert scored[field] == body[field]  # NeMo-Gym reads its own fields back
    if reward:
        assert scored["result"] == [True, True] and "print(n * n)" in scored["extracted_model_code"]


def test_packed_functional_tests_and_the_reasoning_rule(server):
    tests = {"inputs": ["1\n2", "3\n4"], "outputs": ["3", "7"]}
    packed = base64.b64encode(zlib.compress(json.dumps(tests).encode())).decode()
    solution = "```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```"
    right = verify(server, request(solution, {"packed": packed, "fn_name": "add"})).json()
    assert right["reward"] == 1.0 and right["result"] == [True, True], right
    wrong = solution.replace("a + b", "a - b")
    assert verify(server, request(wrong, {**tests, "fn_name": "add"})).json()["reward"] == 0.0
    # one think block in the reasoning is the format; two open tags are not
    answer = "```python\nn = int(input())\nprint(n * n)\n```"
    assert verify(server, request(answer, SQUARE_TESTS, "<think>a</think>")).json()["reward"] == 1
    broken = verify(server, request(answer, SQUARE_TESTS, "<think>a<think>b")).json()
    assert broken["reward"] == 0.0 and broken["reasoning_format_violation_rate"] == 1.0


def test_seed_session_and_requests_it_refuses(server):
    assert httpx.post(f"{server.url}/seed_session", json={}, timeout=10).json() == {}
    answer = "```python\nprint(1)\n```"
    missing = verify(server, request(answer, SQUARE_TESTS) | {"verifier_metadata": {}})
    assert missing.status_code == 422 and "unit_tests" in missing.text
    bomb = base64.b64encode(zlib.compress(b"[" * (64 << 20))).decode()  # 64 MB from 64 KB
    packed = verify(server, request(answer, {"packed": bomb}))
    assert packed.status_code == 413 and "unpacks past" in packed.text
    uneven = verify(server, request(answer, {"inputs": ["1\n"], "outputs": []}))
    assert uneven.status_code == 422
    not_an_object = base64.b64encode(zlib.compress(b"[1, 2]")).decode()
    listed = verify(server, request(answer, {"packed": not_an_object}))
    assert listed.status_code == 422 and "expected an object" in listed.text
