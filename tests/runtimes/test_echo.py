"""The demo echo agent, run by the command runtime against a tiny local Agent server."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent_gateway.config import Address
from agent_gateway.runtimes import echo
from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.signals.handlers import TemplateHandler

from tests import served
from tests.signals.conftest import GatewayFactory, emit, finished, runs_of

# Each test runs agent programs: a processes test (scripts/test --fast leaves it out).
pytestmark = pytest.mark.processes

USER = "0b7c5e4e-52c3-4a83-a7a4-0ad3c1b8f7a2"
ECHO = (sys.executable, "-m", "agent_gateway.runtimes.echo")
DEFAULT_TEMPLATE = "A message from user {{ userId }}:\n\n{{ text }}"


class AgentServer:
    """Answers ``POST /messages`` with ``status`` and records each body."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.status = 201
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                server.posts.append((self.path, json.loads(body)))
                self.send_response(server.status)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"statusCode": 404, "error": "Not Found", "message": "no such User"}')

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = Address("127.0.0.1", self.http.server_address[1])
        self.url = f"http://{self.address}"


@pytest.fixture(autouse=True)
def echo_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The echo agent runs as ``python -m``: give it this checkout's package."""
    monkeypatch.setenv("PYTHONPATH", str(served.SRC))


@pytest.fixture
def agent_server() -> Iterator[AgentServer]:
    server = AgentServer()
    thread = threading.Thread(target=server.http.serve_forever, daemon=True)
    thread.start()
    yield server
    server.http.shutdown()
    server.http.server_close()


def a_run(prompt: str, session: str) -> Any:
    from agent_gateway.store.queries.runs import Run

    return Run("r", "s", session, prompt, "running", None, None, None)


@pytest.mark.parametrize(
    ("prompt", "session", "expected"),
    [
        (f"A message from user {USER}:\n\nhello", f"user_{USER}", (USER, "echo: hello")),
        (f"A message from user {USER}:\n\nhello\n\nworld", "run_x", (USER, "echo: hello\n\nworld")),
        ("free text", f"user_{USER.upper()}", (USER, "echo: free text")),
        ("free text", "run_x", None),
        ("A message from user nobody:\n\nhi", "", None),
    ],
)
def test_which_user_and_what_text(prompt: str, session: str, expected: tuple[str, str] | None) -> None:
    assert echo.answer(prompt, session) == expected


async def test_echo_posts_an_outbound_message_for_the_user(agent_server: AgentServer) -> None:
    runtime = CommandRuntime(ECHO, agent_server_url=agent_server.url)
    await runtime.run(a_run(f"A message from user {USER}:\n\nhi there", f"user_{USER}"))
    assert agent_server.posts == [("/messages", {"userId": USER, "text": "echo: hi there"})]


async def test_echo_fails_the_run_when_no_user_is_named(agent_server: AgentServer) -> None:
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(ECHO, agent_server_url=agent_server.url).run(a_run("hello", "run_1"))
    assert failed.value.message == (
        "the agent program exited with status 1; stderr ends with:\n"
        "echo: neither the Session nor the Prompt names a User; nothing to answer"
    )
    assert agent_server.posts == []


async def test_echo_fails_the_run_when_the_agent_server_refuses(agent_server: AgentServer) -> None:
    agent_server.status = 404
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(ECHO, agent_server_url=agent_server.url).run(a_run("hello", f"user_{USER}"))
    assert failed.value.message.startswith(
        "the agent program exited with status 1; stderr ends with:\n404 Not Found: no such User"
    )
    assert "no such User" in failed.value.message


async def test_echo_fails_the_run_when_the_agent_server_is_unreachable(agent_server: AgentServer) -> None:
    agent_server.http.shutdown()
    agent_server.http.server_close()
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(ECHO, agent_server_url=agent_server.url).run(a_run("hello", f"user_{USER}"))
    assert f"Unreachable: the Agent server at {agent_server.url} did not answer" in failed.value.message


async def test_a_message_signal_is_answered_through_the_agent_server(
    make_gateway: GatewayFactory, agent_server: AgentServer
) -> None:
    """The quickstart's path: message.received → default template → echo → POST /messages."""
    gateway = await make_gateway(
        agent_listen=agent_server.address,
        runtime_command=ECHO,
        handlers={"message.received": {"template": DEFAULT_TEMPLATE, "session": "user_{{ userId }}"}},
    )
    payload = {"id": "m1", "userId": USER, "direction": "inbound", "seq": 1, "text": "ping", "createdAt": "x"}
    signal_id = await emit(gateway.store, "message.received", payload)
    signal = await finished(gateway.store, signal_id)
    assert (signal.state, signal.error) == ("done", None)
    [run] = await runs_of(gateway.store, signal_id)
    assert (run.session, run.prompt, run.state) == (f"user_{USER}", f"A message from user {USER}:\n\nping", "done")
    assert agent_server.posts == [("/messages", {"userId": USER, "text": "echo: ping"})]
    assert isinstance(gateway.handlers.get("message.received"), TemplateHandler)


async def test_echo_kept_warm_answers_each_run_and_fails_only_the_bad_ones(agent_server: AgentServer) -> None:
    """``init``'s setup: the persistent runtime hands the one echo process every Run."""
    runtime = PersistentRuntime(ECHO, agent_server_url=agent_server.url)
    try:
        await runtime.run(a_run("first", f"user_{USER}"))
        with pytest.raises(RunFailed) as failed:
            await runtime.run(a_run("hello", "run_1"))
        assert failed.value.message == "echo: neither the Session nor the Prompt names a User; nothing to answer"
        agent_server.status = 404
        with pytest.raises(RunFailed) as refused:
            await runtime.run(a_run("refused", f"user_{USER}"))
        assert refused.value.message == "404 Not Found: no such User"
        agent_server.status = 201
        await runtime.run(a_run(f"A message from user {USER}:\n\nsecond", "run_2"))
    finally:
        await runtime.close()
    assert [body for _, body in agent_server.posts] == [
        {"userId": USER, "text": "echo: first"},
        {"userId": USER, "text": "echo: refused"},
        {"userId": USER, "text": "echo: second"},
    ]


async def test_a_message_signal_is_answered_by_the_persistent_echo(
    make_gateway: GatewayFactory, agent_server: AgentServer
) -> None:
    gateway = await make_gateway(
        agent_listen=agent_server.address,
        runtime_command=ECHO,
        runtime_mode="persistent",
        handlers={"message.received": {"template": DEFAULT_TEMPLATE, "session": "user_{{ userId }}"}},
    )
    for text in ("ping", "pong"):
        payload = {"id": "m1", "userId": USER, "direction": "inbound", "seq": 1, "text": text, "createdAt": "x"}
        signal = await finished(gateway.store, await emit(gateway.store, "message.received", payload))
        assert (signal.state, signal.error) == ("done", None)
    assert [body["text"] for _, body in agent_server.posts] == ["echo: ping", "echo: pong"]
