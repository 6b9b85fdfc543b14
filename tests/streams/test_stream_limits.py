"""What a Message stream holds for a client that has gone or reads nothing.

In process, through the servers' real connection protocol (``http.connections.Protocol``,
uvicorn's request cycle) over a transport standing for the client: a client that
leaves before its stream's response starts, and one that takes its bytes only when
the server waits for it. Then against a real ``serve``: twenty clients that ask for a
stream and close at once. Every wait is for an event, under a ceiling of minutes.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from agent_gateway.auth import service as auth_service
from agent_gateway.gateway import Gateway
from agent_gateway.http import connections
from agent_gateway.streams.stream import PIECE_BYTES
from agent_gateway.users import service as users_service
from tests import served
from tests.streams.sse import CEILING_S

# The high-water mark of asyncio's and uvloop's transports: past it, the protocol is paused.
HIGH_WATER = 65536


class Client:
    """The transport of one connection, standing for its client: what the server writes stays
    buffered here until the client takes it (:meth:`take`), and past ``HIGH_WATER`` the
    protocol is paused, as a real transport pauses it, until then."""

    def __init__(self) -> None:
        self.protocol: connections.Protocol | None = None
        self.received = bytearray()  # everything taken
        self.buffered = bytearray()  # written, not taken yet
        self.most_buffered = 0
        self.paused = False
        self.closing = False
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.buffered += data
        self.most_buffered = max(self.most_buffered, len(self.buffered))
        if len(self.buffered) > HIGH_WATER and not self.paused and self.protocol is not None:
            self.paused = True
            self.protocol.pause_writing()
        self.changed.set()

    def take(self) -> None:
        self.received += self.buffered
        self.buffered.clear()
        if self.paused and self.protocol is not None:
            self.paused = False
            self.protocol.resume_writing()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8700)}.get(name, default)


def connect(app: Any, client: Client) -> tuple[connections.Protocol, ServerState]:
    """A connection of a server running ``app``, as ``serve`` makes them, to ``client``."""
    config = uvicorn.Config(connections.guard(app), lifespan="off", ws="none", log_config=None, proxy_headers=False)
    config.load()
    state = ServerState()
    limits = connections.Limits(max_connections=10, header_timeout_s=60, max_header_bytes=65536, body_timeout_s=60)
    protocol = connections.Protocol(config=config, server_state=state, app_state={}, limits=limits)
    client.protocol = protocol
    protocol.connection_made(client)  # type: ignore[arg-type]
    return protocol, state


async def user_with_token(gateway: Gateway) -> tuple[str, str]:
    async with gateway.store.transaction() as conn:
        user = await users_service.admit(conn)
        issued = await auth_service.issue_token(conn, user.id, ttl_ms=3_600_000)
    return user.id, issued.to_json()["token"]


def stream_request(server: str, user_id: str, token: str) -> str:
    """``GET /messages/stream`` of ``user_id``'s log on ``server``, as it takes it."""
    if server == "public":
        return f"GET /messages/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
    return f"GET /messages/stream?user={user_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def wait_until(condition: Any) -> None:
    async with asyncio.timeout(CEILING_S):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("server", ["public", "agent"])
async def test_a_stream_whose_client_left_before_it_started_ends(gateway: Gateway, server: str) -> None:
    user_id, token = await user_with_token(gateway)
    app = gateway.public_asgi if server == "public" else gateway.agent_asgi
    request = stream_request(server, user_id, token)
    client = Client()
    protocol, state = connect(app, client)
    protocol.data_received(request.encode())
    # Gone in the same turn: the request's task has not run a step (authentication, on the
    # Public server, is still to come), so its stream starts after the connection went.
    protocol.connection_lost(None)
    assert state.tasks
    await wait_until(lambda: not state.tasks)
    assert len(gateway.streams) == 0  # no subscription left behind (and no follower of the Hub's tick)
    assert not gateway.streams._followers


def sse_messages(raw: bytes) -> list[tuple[int, str]]:
    """The (id, data) of each whole event of a chunked text/event-stream response received so far."""
    if b"\r\n\r\n" not in raw:
        return []
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
    body = bytearray()
    while b"\r\n" in rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0 or len(rest) < size + 2:
            break  # the end, or a chunk still arriving
        body += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]
    found = []
    for block in bytes(body).split(b"\n\n")[:-1]:  # the last is not whole yet
        if block.startswith(b"id: "):
            id_line, _, data_line = block.split(b"\n")
            found.append((int(id_line[4:]), data_line.removeprefix(b"data: ").decode()))
    return found


async def test_a_slow_reader_is_sent_pieces_of_the_buffer_and_every_message_whole(gateway: Gateway) -> None:
    """A backlog of large and small Messages to a client that takes its bytes only once the
    server waits for it: the server never holds more than about the transport's buffer and one
    piece for it (not a page of Messages), and the client gets every Message whole, in order."""
    user_id, _ = await user_with_token(gateway)
    texts = [("L" if n % 3 == 0 else "s") * (200_000 if n % 3 == 0 else 100) + str(n) for n in range(30)]
    transport = httpx.ASGITransport(app=gateway.agent_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as agent:
        for text in texts:
            response = await agent.post("/messages", json={"userId": user_id, "text": text})
            assert response.status_code == 201
    client = Client()
    protocol, state = connect(gateway.agent_asgi, client)
    waiting = asyncio.Event()
    drain = protocol.flow.drain

    async def waiting_drain() -> None:
        waiting.set()  # the server waits for the client: it has written what it may
        client.changed.set()
        await drain()

    protocol.flow.drain = waiting_drain  # type: ignore[method-assign]
    protocol.data_received(f"GET /messages/stream?user={user_id}&after=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    waits = 0
    try:
        async with asyncio.timeout(CEILING_S):
            while len(sse_messages(bytes(client.received + client.buffered))) < len(texts):
                await client.changed.wait()
                client.changed.clear()
                if waiting.is_set():
                    waiting.clear()
                    waits += 1
                    client.take()
        received = sse_messages(bytes(client.received + client.buffered))
        assert [seq for seq, _ in received] == list(range(1, len(texts) + 1))
        assert [orjson.loads(data)["text"] for _, data in received] == texts
        # The buffer (64 KiB) and one piece, and the response's head and keep-alive.
        assert client.most_buffered <= HIGH_WATER + PIECE_BYTES + 1024, client.most_buffered
        assert waits > 10  # the server waited for the client many times over: it was held up
    finally:
        protocol.connection_lost(None)
        await wait_until(lambda: not state.tasks)
    assert len(gateway.streams) == 0


# --- Against a real serve ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url) as gateway:
        yield gateway


def streams_answered(gateway: served.ServedGateway, server: str) -> float:
    """How many ``GET /messages/stream`` requests ``server`` has finished (any status), from /metrics."""
    metrics = httpx.get(f"{gateway.ops_url}/metrics", timeout=CEILING_S).text
    total = 0.0
    for labels, value in re.findall(r"^agent_gateway_http_requests_total\{([^}]*)\} (\S+)$", metrics, re.MULTILINE):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found.get("route") == "/messages/stream" and found.get("server") == server:
            total += float(value)
    return total


@pytest.mark.e2e
@pytest.mark.parametrize("server", ["public", "agent"])
async def test_streams_of_clients_that_closed_at_once_end(
    gateway_process: served.ServedGateway, module_database_url: str, server: str
) -> None:
    """Twenty clients ask for a stream and close without waiting (the reproduction): all twenty
    streams end, whoever of the client and the route was first."""
    user = gateway_process.cli_json("users", "add")
    token = gateway_process.cli_json("tokens", "issue", user["id"])["token"]
    url = gateway_process.public_url if server == "public" else gateway_process.agent_url
    request = stream_request(server, user["id"], token)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    before = streams_answered(gateway_process, server)
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=CEILING_S) as sock:
            sock.sendall(request.encode())
    async with asyncio.timeout(CEILING_S):
        while streams_answered(gateway_process, server) < before + 20:
            await asyncio.sleep(0.1)
