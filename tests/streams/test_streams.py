"""Message streams (issue 13) against a real ``agent-gateway serve`` on both backends.

The stream tests read off real sockets; the refusals and the OpenAPI
description are checked in process. Nothing here waits for a duration: every
wait is for an event, under a ceiling of minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from agent_gateway.auth import service as auth_service
from agent_gateway.gateway import Gateway
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from tests import served
from tests.messages.records import assert_error
from tests.streams.sse import CEILING_S, EventReader, open_stream

pytestmark = pytest.mark.processes

# Short enough that the tests see keep-alives and Token checks at once.
QUICK = {
    "AGENT_GATEWAY_STREAMS_KEEP_ALIVE_MS": "100",
    "AGENT_GATEWAY_STREAMS_AUTH_CHECK_MS": "100",
    "AGENT_GATEWAY_STREAMS_STALL_MS": "500",
    # An agent that answers nothing: every Message in these streams is one the test wrote.
    "AGENT_GATEWAY_RUNTIME_COMMAND": '["true"]',
    "AGENT_GATEWAY_RUNTIME_MODE": "per-run",
}


async def new_user(database_url: str, ttl_ms: int = 3_600_000) -> tuple[str, str]:
    """A User admitted straight in the database, and a Token of theirs."""
    store = Store(database_url)
    try:
        async with store.transaction() as conn:
            user = await users_service.admit(conn)
            issued = await auth_service.issue_token(conn, user.id, ttl_ms=ttl_ms)
        return user.id, issued.to_json()["token"]
    finally:
        await store.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    """One gateway per backend for the tests that change nothing of it: each writes to Users of its own."""
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url, QUICK) as gateway:
        yield gateway


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(CEILING_S)) as client:
        yield client


async def send(client: httpx.AsyncClient, gateway: served.ServedGateway, user_id: str, text: str) -> dict:
    response = await client.post(f"{gateway.agent_url}/messages", json={"userId": user_id, "text": text})
    assert response.status_code == 201, response.text
    return response.json()


async def test_the_backlog_and_live_messages_meet_without_gap_or_duplicate(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    user_id, token = await new_user(module_database_url)
    for n in range(1, 6):
        await send(client, gateway_process, user_id, f"before {n}")

    async def write_more() -> None:
        for n in range(6, 41):
            await send(client, gateway_process, user_id, f"during {n}")

    # Messages are written while the stream reads its backlog and turns live.
    writer = asyncio.create_task(write_more())
    async with open_stream(
        client, f"{gateway_process.public_url}/messages/stream", params={"after": "2"}, headers=bearer(token)
    ) as stream:
        received = await stream.messages(38)
        await writer
        log = (await client.get(f"{gateway_process.agent_url}/messages", params={"user": user_id, "after": "2", "limit": "200"})).json()
    assert [m["seq"] for m in received] == list(range(3, 41))
    # Each event is the Message exactly as the log read returns it.
    assert received == log["messages"]


async def test_the_agent_server_follows_any_users_log(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    user_id, _ = await new_user(module_database_url)
    other_id, _ = await new_user(module_database_url)
    await send(client, gateway_process, user_id, "old")
    async with open_stream(client, f"{gateway_process.agent_url}/messages/stream", params={"user": user_id.upper()}) as stream:
        # With no cursor: only Messages committed after the stream opened.
        await send(client, gateway_process, other_id, "not theirs")
        inbound = await client.post(
            f"{gateway_process.public_url}/messages", json={"text": "from the User"}, headers=bearer(_ := (await new_token(module_database_url, user_id)))
        )
        assert inbound.status_code == 201
        await send(client, gateway_process, user_id, "new")
        received = await stream.messages(2)
    assert [(m["seq"], m["direction"], m["text"]) for m in received] == [
        (2, "inbound", "from the User"),
        (3, "outbound", "new"),
    ]


async def new_token(database_url: str, user_id: str) -> str:
    store = Store(database_url)
    try:
        async with store.transaction() as conn:
            return (await auth_service.issue_token(conn, user_id, ttl_ms=3_600_000)).to_json()["token"]
    finally:
        await store.close()


async def test_last_event_id_resumes_after_it_and_wins_over_after(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    user_id, token = await new_user(module_database_url)
    for n in range(1, 5):
        await send(client, gateway_process, user_id, f"m{n}")
    headers = {**bearer(token), "Last-Event-ID": "2"}
    async with open_stream(
        client, f"{gateway_process.public_url}/messages/stream", params={"after": "0"}, headers=headers
    ) as stream:
        assert [m["seq"] for m in await stream.messages(2)] == [3, 4]
        await send(client, gateway_process, user_id, "m5")
        assert [m["seq"] for m in await stream.messages(1)] == [5]


async def test_keep_alive_comments_arrive_while_nothing_is_written(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    _, token = await new_user(module_database_url)
    async with open_stream(client, f"{gateway_process.public_url}/messages/stream", headers=bearer(token)) as stream:
        for _ in range(2):
            event = await stream.next()
            assert event is not None and event.comments == ("keep-alive",) and event.event is None


async def test_revoking_the_token_ends_the_stream(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    _, token = await new_user(module_database_url)
    async with open_stream(client, f"{gateway_process.public_url}/messages/stream", headers=bearer(token)) as stream:
        revoked = await client.delete(f"{gateway_process.public_url}/auth/tokens/current", headers=bearer(token))
        assert revoked.status_code == 204
        while (event := await stream.next()) is not None:
            assert event.event is None  # only keep-alives until the end
    again = await client.get(f"{gateway_process.public_url}/messages/stream", headers=bearer(token))
    assert_error(again, 401)


async def test_the_stream_ends_when_its_token_expires(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    _, token = await new_user(module_database_url, ttl_ms=1_000)
    response = await client.get(f"{gateway_process.public_url}/messages/stream", headers=bearer(token))
    if response.status_code == 401:
        return  # it expired before the stream opened (a loaded machine): nothing left to see
    # client.get returns only once the server has ended the response: the Token's expiry ended it.
    assert response.status_code == 200
    assert "event: message" not in response.text


async def test_a_stream_of_another_scheme_asks_it_again_and_ends_when_it_refuses(
    tmp_path: Path, database_url: str, client: httpx.AsyncClient
) -> None:
    user_id, _ = await new_user(database_url)
    env = {
        **QUICK,
        "AGENT_GATEWAY_SIGNALS_SETUP": "tests.streams.scheme_setup:setup",
        "STREAM_TEST_REVOKED_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(served.SRC), str(served.SRC.parent)]),
    }
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        headers = {"Authorization": f"Bearer test-{user_id}"}
        async with open_stream(client, f"{gateway.public_url}/messages/stream", headers=headers) as stream:
            await send(client, gateway, user_id, "seen")
            [message] = await stream.messages(1)
            assert message["text"] == "seen"
            (tmp_path / f"revoked-{user_id}").touch()
            while (event := await stream.next()) is not None:
                assert event.event is None
        assert_error(await client.get(f"{gateway.public_url}/messages/stream", headers=headers), 401)


async def test_a_reader_that_falls_behind_is_disconnected_and_others_go_on(
    gateway_process: served.ServedGateway, module_database_url: str, client: httpx.AsyncClient
) -> None:
    slow_id, slow_token = await new_user(module_database_url)
    other_id, other_token = await new_user(module_database_url)
    host, port = gateway_process.public_url.removeprefix("http://").split(":")
    # A client that asks for its stream and then reads nothing, with a tiny receive buffer.
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    try:
        slow.sendall(
            f"GET /messages/stream?after=0 HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {slow_token}\r\n\r\n".encode()
        )
        async with open_stream(client, f"{gateway_process.public_url}/messages/stream", headers=bearer(other_token)) as other:
            big = "x" * 500_000
            sent = 0
            # Enough to fill every buffer between the server and the slow reader, many times over.
            while "fell behind" not in gateway_process.output():
                assert sent < 400, gateway_process.output()
                await send(client, gateway_process, slow_id, big)
                sent += 1
            # The other stream was never held up.
            await send(client, gateway_process, other_id, "still here")
            [message] = await other.messages(1)
            assert message["text"] == "still here"
        # The slow reader finds its connection closed before the last Message.
        slow.settimeout(CEILING_S)
        received = b""
        try:
            while chunk := slow.recv(1 << 20):
                received += chunk
        except ConnectionResetError:
            pass
        assert f"id: {sent}\n".encode() not in received
    finally:
        slow.close()


async def test_shutdown_ends_open_streams_and_serve_exits(tmp_path: Path, database_url: str) -> None:
    user_id, token = await new_user(database_url)
    with served.ServedGateway.start(tmp_path / "deployment", database_url, QUICK) as gateway:
        async with httpx.AsyncClient(timeout=httpx.Timeout(CEILING_S)) as client:
            async with open_stream(client, f"{gateway.public_url}/messages/stream", headers=bearer(token)) as stream:
                async with open_stream(client, f"{gateway.agent_url}/messages/stream", params={"user": user_id}) as agent:
                    gateway.process.send_signal(signal.SIGTERM)
                    assert await asyncio.to_thread(gateway.process.wait, CEILING_S) == 0
                    for reader in (stream, agent):
                        while (event := await reader.next()) is not None:
                            assert event.event is None


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
async def test_streams_in_every_http_process_receive_messages_written_in_any(
    tmp_path: Path, database_url: str
) -> None:
    user_id, token = await new_user(database_url)
    env = {**QUICK, "AGENT_GATEWAY_HTTP_WORKERS": "2"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        # Separate connections, opened until both HTTP processes hold some of them.
        streams: list[EventReader] = []
        holders: set[int] = set()
        async with contextlib.AsyncExitStack() as opened:
            async with asyncio.timeout(CEILING_S):
                while len(holders) < 2 or len(streams) < 4:
                    client = await opened.enter_async_context(httpx.AsyncClient(timeout=httpx.Timeout(CEILING_S)))
                    url = f"{gateway.public_url}/messages/stream"
                    streams.append(await opened.enter_async_context(open_stream(client, url, headers=bearer(token))))
                    holders.add(holder(gateway, streams[-1]))
            # Written through fresh connections, so by either process.
            for n in range(1, 9):
                async with httpx.AsyncClient(timeout=httpx.Timeout(CEILING_S)) as writer:
                    await send(writer, gateway, user_id, f"m{n}")
            for stream in streams:
                assert [m["seq"] for m in await stream.messages(8)] == list(range(1, 9))


def holder(gateway: served.ServedGateway, stream: EventReader) -> int:
    """The pid of the gateway process holding the server end of ``stream``'s connection."""
    network_stream = stream.response.extensions["network_stream"]
    client_port = network_stream.get_extra_info("socket").getsockname()[1]
    server_port = int(gateway.public_url.rsplit(":", 1)[1])
    inode = None
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                inode = fields[9]
    assert inode is not None
    for pid in [gateway.process.pid, *children(gateway.process.pid)]:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except FileNotFoundError:
                continue
    raise AssertionError("no gateway process holds the connection")


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as file:
        return [int(child) for child in file.read().split()]


# --- Refusals before the stream starts, and the description (in process) --------


@pytest.mark.parametrize(
    "query",
    [
        "after=-1",
        "after=01",
        "after=2147483648",
        "after=abc",
        "after=1&after=2",
        "user=00000000-0000-4000-8000-000000000000",
        "limit=5",
        "before=3",
    ],
)
async def test_the_public_stream_refuses_bad_parameters(
    gateway: Gateway, public: httpx.AsyncClient, query: str
) -> None:
    _, token = await new_user(gateway.settings.database_url)
    assert_error(await public.get(f"/messages/stream?{query}", headers=bearer(token)), 400)


async def test_the_streams_refuse_a_bad_last_event_id_and_a_missing_token(
    gateway: Gateway, public: httpx.AsyncClient, agent: httpx.AsyncClient
) -> None:
    user_id, token = await new_user(gateway.settings.database_url)
    for value in ("-1", "x", "2147483648"):
        assert_error(await public.get("/messages/stream", headers={**bearer(token), "Last-Event-ID": value}), 400)
        assert_error(await agent.get(f"/messages/stream?user={user_id}", headers={"Last-Event-ID": value}), 400)
    assert_error(await public.get("/messages/stream"), 401)
    assert_error(await public.get("/messages/stream", headers=bearer("agw_" + "A" * 43)), 401)


@pytest.mark.parametrize("query", ["", "user=nope", "user=00000000-0000-4000-8000-000000000000&after=-1", "after=1", "x=1"])
async def test_the_agent_stream_requires_a_user_and_refuses_bad_parameters(agent: httpx.AsyncClient, query: str) -> None:
    assert_error(await agent.get(f"/messages/stream?{query}"), 400)


async def test_the_streams_are_in_both_servers_openapi(agent: httpx.AsyncClient, public: httpx.AsyncClient) -> None:
    for client, statuses in ((agent, {"200", "400", "503"}), (public, {"200", "400", "401", "503"})):
        route = (await client.get("/openapi.json")).json()["paths"]["/messages/stream"]["get"]
        assert statuses <= set(route["responses"])
        assert "text/event-stream" in route["responses"]["200"]["content"]
        names = {parameter["name"] for parameter in route["parameters"]}
        assert {"after", "Last-Event-ID"} <= names
        assert ("user" in names) == (client is agent)
