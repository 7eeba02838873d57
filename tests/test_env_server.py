"""``codepost env-server``: for real, a server process on 127.0.0.1 with its Docker pool reached
by OpenEnv's own client (``openenv-core`` from PyPI) and by plain HTTP; then its bounds, fast,
on its app over an executor in this process."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import servers
from fake_executors import InProcessExecutor
from servers import Server
from starlette.testclient import TestClient, WebSocketDenialResponse

from codepost.verifiers import verify_command
from codepost.verifiers.env_server import EnvServerConfig, create_app

TOKEN = "env-token-1"
WRONG = "```python\ndef similar_elements(a, b):\n    return ()\n```"
RIGHT = "```python\ndef similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n```"
PUBLIC_ONLY = "```python\ndef similar_elements(a, b):\n    return (4, 5)\n```"  # MBPP/2's first


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with servers.running_server(
        "env-server",
        tmp_path_factory.mktemp("env-server"),
        *("--workers", "2", "--max-answer-chars", "2000", "--header-timeout-s", "2"),
        env={verify_command.TOKEN_ENV: TOKEN},
    ) as up:
        yield up


def openenv_client(server: Server, token: str | None = TOKEN) -> Any:
    """OpenEnv's generic client, synchronous; it sets no headers of its own, so the token
    travels as the URL's password."""
    from openenv.core.generic_client import GenericEnvClient  # imports gradio: 7 s

    host = server.url.removeprefix("http://")
    url = f"http://codepost:{token}@{host}" if token else server.url
    return GenericEnvClient(base_url=url).sync()


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.docker
def test_openenv_client_runs_an_episode_to_its_reward(server):
    with openenv_client(server) as env:
        first = env.reset(problems="mbpp", task_id="2")
        assert not first.done and first.reward is None
        assert first.observation["text"].startswith("Write a function to find the similar")
        assert first.observation["turn"] == 0
        time.sleep(3)  # past the header time-out, which ends only connections still in HTTP
        wrong = env.step({"answer": WRONG})
        assert not wrong.done and wrong.reward is None
        text = wrong.observation["text"]
        assert text.startswith("Your program passed 0 of 1 public tests. Public test 1 failed")
        assert "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)" in text
        right = env.step({"answer": RIGHT})
        assert right.done and right.reward == 1.0
        assert right.observation["info"]["end"] == "passed" and right.observation["turn"] == 2
        assert env.state()["step_count"] == 2
        # a new episode in the same connection: the hidden tests score a public-only answer 0
        env.reset(problems="mbpp", task_id="2")
        fooled = env.step({"answer": PUBLIC_ONLY})
        assert fooled.done and fooled.observation["info"]["end"] == "passed"
        assert fooled.reward == 0.0


@pytest.mark.docker
def test_openenv_client_is_told_what_is_wrong(server):
    with openenv_client(server) as env:
        with pytest.raises(
            RuntimeError, match=r"unknown problem 'nope' in 'mbpp' \(974 problems\)"
        ):
            env.reset(problems="mbpp", task_id="nope")
        with pytest.raises(RuntimeError, match="unknown problem set 'mbbp'"):
            env.reset(problems="mbbp", task_id="2")
        with pytest.raises(RuntimeError, match="no episode in this session: reset first"):
            env.step({"answer": RIGHT})
        env.reset(problems="mbpp", task_id="2")
        with pytest.raises(RuntimeError, match="2500 characters, over the server's max_answer"):
            env.step({"answer": "x" * 2500})
        assert env.step({"answer": RIGHT}).done  # the refused step changed nothing
        with pytest.raises(RuntimeError, match=r"the episode of '2' is done after 1 answers"):
            env.step({"answer": RIGHT})
    for token in ("not-the-token", None):
        with pytest.raises(ConnectionError, match="HTTP 401"), openenv_client(server, token) as env:
            env.reset(problems="mbpp", task_id="2")


@pytest.mark.docker
def test_http_bad_input_gets_a_4xx_that_names_the_problem(server):
    def post(path: str, body: dict[str, Any], token: str = TOKEN) -> httpx.Response:
        return httpx.post(f"{server.url}{path}", json=body, headers=bearer(token), timeout=60)

    refused = post("/reset", {"problems": "mbpp", "task_id": "2"}, token="wrong")
    assert refused.status_code == 401 and "bearer token" in refused.json()["detail"]
    unknown = post("/reset", {"problems": "mbpp", "task_id": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == "unknown problem 'nope' in 'mbpp' (974 problems)"
    session = post("/reset", {"problems": "mbpp", "task_id": "2"}).json()["observation"]
    step = {"session_id": session["session_id"]}
    big = post("/step", {**step, "action": {"answer": "x" * 2500}})
    assert big.status_code == 413 and "over the server's max_answer_chars 2000" in big.text
    done = post("/step", {**step, "action": {"answer": RIGHT}})
    assert done.status_code == 200 and done.json()["done"] and done.json()["reward"] == 1.0
    again = post("/step", {**step, "action": {"answer": RIGHT}})
    assert again.status_code == 409 and "is done after 1 answers" in again.json()["detail"]
    stranger = post("/step", {"session_id": "guess", "action": {"answer": RIGHT}})
    assert stranger.status_code == 404 and "no session 'guess'" in stranger.json()["detail"]


@pytest.mark.docker
def test_two_sessions_do_not_see_each_others_state(server):
    with openenv_client(server) as first, openenv_client(server) as second:
        first.reset(problems="mbpp", task_id="2")
        second.reset(problems="humaneval", task_id="HumanEval/0")
        reply = first.step({"answer": WRONG})
        assert "similar_elements" in reply.observation["text"]
        assert second.state()["step_count"] == 0
        assert second.state()["task_id"] == "HumanEval/0"
        other = second.step(
            {"answer": "```python\ndef has_close_elements(n, t):\n    return None\n```"}
        )
        assert "candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)" in other.observation["text"]
        assert "similar_elements" not in other.observation["text"]
        assert first.state()["step_count"] == 1 and first.state()["task_id"] == "2"
        assert first.state()["episode_id"] != second.state()["episode_id"]


# -- the app's bounds, fast, over an executor in this process


def app_for(**settings: Any) -> Any:
    config = EnvServerConfig(token=TOKEN, **settings)
    return create_app(config, InProcessExecutor())  # type: ignore[arg-type]


def http(app: Any, *calls: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    """The answers to ``calls`` (method, path, JSON body or query), one after another."""

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://server", headers=bearer()
        ) as client:
            answers = []
            for method, path, body in calls:
                options = {"params": body} if method == "GET" else {"json": body}
                answers.append(await client.request(method, path, **options))
            return answers

    return asyncio.run(send())


MBPP_2 = ("POST", "/reset", {"problems": "mbpp", "task_id": "2"})


def test_sessions_are_bounded_in_number():
    app = app_for(max_sessions=2)
    first, second, third = http(app, MBPP_2, MBPP_2, MBPP_2)
    assert third.status_code == 503 and third.headers["Retry-After"] == "1"
    assert "2 of 2 sessions open" in third.json()["detail"]
    ids = [answer.json()["observation"]["session_id"] for answer in (first, second)]
    assert len(set(ids)) == 2 and all(len(session_id) >= 24 for session_id in ids)
    closed, reopened = http(app, ("POST", "/close", {"session_id": ids[0]}), MBPP_2)
    assert closed.status_code == 200 and reopened.status_code == 200
    (gone,) = http(app, ("GET", "/state", {"session_id": ids[0]}))
    assert gone.status_code == 404


def test_an_idle_session_is_closed():
    app = app_for(session_idle_s=0.2)
    (reset,) = http(app, MBPP_2)
    session_id = reset.json()["observation"]["session_id"]
    time.sleep(0.5)  # past the idle time: closed on the next look-up
    (late,) = http(app, ("POST", "/step", {"session_id": session_id, "action": {"answer": RIGHT}}))
    assert late.status_code == 404 and "closed after 0.2 s idle" in late.json()["detail"]


def test_resets_are_checked_before_a_session_opens():
    app = app_for(max_sessions=1, max_problem_tests=3)
    bad_config, unknown_env, neither, too_many, inline = http(
        app,
        ("POST", "/reset", {"task_id": "HumanEval/0", "config": {"max_turns": 0}}),
        ("POST", "/reset", {"environment": "chess", "task_id": "HumanEval/0"}),
        ("POST", "/reset", {"problems": "mbpp"}),
        (
            "POST",
            "/reset",
            {"problem": {"task_id": "t", "prompt": "p", "test_list": ["assert 1"] * 4}},
        ),
        (
            "POST",
            "/reset",
            {"problem": {"task_id": "t", "prompt": "Say 1.", "test_list": ["assert f() == 1"]}},
        ),
    )
    assert bad_config.status_code == 422
    assert bad_config.json()["detail"] == (
        "config: field 'max_turns': Input should be greater than or equal to 1"
    )
    assert unknown_env.status_code == 404
    assert unknown_env.json()["detail"] == "unknown environment 'chess' (known: execution-feedback)"
    assert neither.status_code == 422 and "name one problem" in neither.json()["detail"]
    assert too_many.status_code == 413
    assert "problem 't' has 4 tests, over the server's max_problem_tests 3" in too_many.text
    # none of the refused resets kept a session: the one session there is, is the inline one
    assert inline.status_code == 200 and inline.json()["observation"]["task_id"] == "t"
    assert (
        "Your code should pass this test:\nassert f() == 1" in inline.json()["observation"]["text"]
    )


def test_the_server_caps_an_episodes_turns_whatever_its_config_asks():
    app = app_for(max_turns=2)
    (reset,) = http(app, MBPP_2)
    step = {"session_id": reset.json()["observation"]["session_id"], "action": {"answer": WRONG}}
    first, second, third = http(app, *[("POST", "/step", step)] * 3)
    assert first.json()["done"] is False
    assert second.json()["done"] is True and second.json()["reward"] == 0.0
    assert second.json()["observation"]["info"]["end"] == "turns"
    assert third.status_code == 409


def test_a_websocket_speaks_openenvs_messages_and_answers_mistakes_with_their_status():
    client = TestClient(app_for())
    with client.websocket_connect("/ws", headers=bearer()) as socket:

        def ask(message: Any) -> dict[str, Any]:
            socket.send_text(message if isinstance(message, str) else json.dumps(message))
            return json.loads(socket.receive_text())

        assert ask("{not json")["data"]["status"] == 400
        unknown = ask({"type": "dance"})["data"]
        assert (
            unknown["status"] == 400
            and "reset, step, state or close; got 'dance'" in (unknown["message"])
        )
        early = ask({"type": "step", "data": {"answer": RIGHT}})
        assert early == {
            "type": "error",
            "data": {
                "message": "no episode in this session: reset first",
                "code": "SESSION_ERROR",
                "status": 409,
            },
        }
        typo = ask({"type": "step", "data": {"answr": RIGHT}})["data"]
        assert typo["status"] == 422 and "answr" in typo["message"]
        reset = ask({"type": "reset", "data": {"problems": "mbpp", "task_id": "2"}})
        assert reset["type"] == "observation" and reset["data"]["done"] is False
        done = ask({"type": "step", "data": {"answer": RIGHT}})
        assert done["data"]["done"] and done["data"]["reward"] == 1.0
        assert ask({"type": "state"})["data"]["step_count"] == 1
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect("/ws"):
        pass
    assert denied.value.status_code == 401 and "bearer token" in denied.value.json()["detail"]
