"""What the agent can make the gateway hold: the relay's and the egress proxy's connections are capped
(each costs the gateway two descriptors), one past the cap is answered 503 and closed with one log line
per burst, a pair ends with its upstream's side, refusals log a bounded, escaped host at most once a
minute per host, and the confined program's own descriptors are limited (RLIMIT_NOFILE)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.config import Address
from agent_gateway.ops import metrics
from agent_gateway.sandbox import choose, inside, proxy, relay
from agent_gateway.sandbox.bubblewrap import Sandbox
from agent_gateway.sandbox.proxy import EgressProxy
from agent_gateway.sandbox.relay import Relay
from tests.sandbox.test_faults import a_run, confined, runtime
from tests.signals.conftest import until

# Descriptors the test process itself may open besides those counted (the event loop's, a log handler's,
# a spawned program's pipes): a margin, far below what an uncapped relay would take.
SLACK = 24
# Connections opened past a cap.
PAST = 36


class Upstream:
    """A local TCP server that keeps every connection open, never answering (an Agent server busy with
    long requests, a remote host); or, ``answering``, reads a request head, answers and closes."""

    def __init__(self, answering: bool = False) -> None:
        self.answering = answering
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.answering:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            writer.close()
            return
        self._writers.append(writer)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    yield server
    await server.close()


def descriptors() -> int:
    """How many descriptors this process holds now."""
    return len(os.listdir("/proc/self/fd"))


def sockets() -> set[str]:
    """The sockets this process holds now (``socket:[inode]``): by identity, so that another test's
    leftover closed meanwhile (by the garbage collector, say) does not count."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # gone since listed
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                held.add(target)
    return held


async def unix_client(path: str, request: bytes = b"") -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(client, path)
    if request:
        await loop.sock_sendall(client, request)
    return client


async def received(client: socket.socket) -> bytes:
    """Everything ``client`` receives until its end; a reset after the answer (the gateway closed the
    connection unread) ends it too, the answer still read first, as the kernel delivers it."""
    loop = asyncio.get_running_loop()
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await loop.sock_recv(client, 65536):
            data += chunk
    return data


async def answer(path: str, request: bytes) -> bytes:
    """What one connection to ``path`` sending ``request`` receives."""
    client = await unix_client(path, request)
    try:
        return await received(client)
    finally:
        client.close()


async def refusals_past_the_cap(
    path: str, count: int, refused: int, request: bytes = b""
) -> tuple[list[socket.socket], list[socket.socket], list[bytes]]:
    """Open ``count`` connections to ``path`` and wait until ``refused`` of them have ended: all the
    connections, those still open, and the answers of those that ended."""
    clients = [await unix_client(path, request) for _ in range(count)]
    reads = [asyncio.ensure_future(received(client)) for client in clients]
    try:
        await until(lambda: sum(read.done() for read in reads) >= refused)
        kept = [client for client, read in zip(clients, reads, strict=True) if not read.done()]
        return clients, kept, [read.result() for read in reads if read.done()]
    finally:
        for read in reads:
            read.cancel()


async def test_the_relay_refuses_past_its_cap_with_one_log_line_and_the_gateway_holds_a_bounded_count(
    tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    end = Relay(str(tmp_path / "agent.sock"), "127.0.0.1", upstream.port)
    await end.start()
    clients: list[socket.socket] = []
    try:
        before = descriptors()
        with caplog.at_level(logging.INFO, logger="agent_gateway.sandbox"):
            clients, kept, answers = await refusals_past_the_cap(end.path, relay.MAX_CONNECTIONS + PAST, PAST)
            await until(lambda: upstream.accepted == relay.MAX_CONNECTIONS)
        assert len(answers) == PAST
        assert all(answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for answer in answers), answers[0]
        assert answers[0].endswith(b'"message":"the agent may have 64 connections open; retry later"}')
        assert end.connections() == relay.MAX_CONNECTIONS
        # The clients' own, and for each relayed one the relay's two and the upstream's one.
        assert descriptors() - before <= len(clients) + 3 * relay.MAX_CONNECTIONS + SLACK
        [line] = [r for r in caplog.records if getattr(r, "action", None) == "sandbox_relay_refused"]
        assert line.levelno == logging.WARNING
        assert line.getMessage() == (
            "the agent has 64 connections to the Agent server open, the most allowed: refusing more"
        )

        # An agent that closes connections gets new ones relayed.
        kept[0].close()
        await until(lambda: end.connections() < relay.MAX_CONNECTIONS)
        clients.append(await unix_client(end.path))
        await until(lambda: upstream.accepted == relay.MAX_CONNECTIONS + 1)
    finally:
        for client in clients:
            client.close()
        await end.close()


async def test_a_pair_ends_when_the_agent_servers_side_closes_though_the_agent_keeps_its_own(
    tmp_path: Path
) -> None:
    server = Upstream(answering=True)
    await server.start()
    end = Relay(str(tmp_path / "agent.sock"), "127.0.0.1", server.port)
    await end.start()
    try:
        before = sockets()
        client = await unix_client(end.path, b"GET /x HTTP/1.1\r\nHost: agent\r\n\r\n")
        try:
            assert (await received(client)).endswith(b"\r\n\r\nok")
            # The agent never closes its end: the relay's two sockets go all the same.
            mine = {os.readlink(f"/proc/self/fd/{client.fileno()}")}
            await until(lambda: end.connections() == 0 and sockets() - before == mine)
        finally:
            client.close()
    finally:
        await end.close()
        await server.close()


async def test_the_proxy_refuses_past_its_cap(tmp_path: Path, upstream: Upstream) -> None:
    egress = EgressProxy(str(tmp_path / "proxy.sock"), [Address("127.0.0.1", upstream.port)])
    await egress.start()
    clients: list[socket.socket] = []
    try:
        before = descriptors()
        connect = b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % upstream.port
        clients, _, answers = await refusals_past_the_cap(egress.path, proxy.MAX_CONNECTIONS + PAST, PAST, connect)
        await until(lambda: upstream.accepted == proxy.MAX_CONNECTIONS)
        assert len(answers) == PAST
        assert all(answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for answer in answers), answers[0]
        assert egress.connections() == proxy.MAX_CONNECTIONS
        assert descriptors() - before <= len(clients) + 3 * proxy.MAX_CONNECTIONS + SLACK
    finally:
        for client in clients:
            client.close()
        await egress.close()


async def test_a_refused_host_is_logged_bounded_escaped_and_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    egress = EgressProxy(str(tmp_path / "proxy.sock"), [])
    await egress.start()
    # Up to the 64 KiB of a request head, with a terminal escape at its start.
    host = b"evil\x1b\x07" + b"x" * 60_000 + b".example"
    request = b"CONNECT %s:443 HTTP/1.1\r\n\r\n" % host
    try:
        before = metrics.egress_refused._value.get()
        with caplog.at_level(logging.INFO, logger="agent_gateway.sandbox"):
            for _ in range(200):
                assert (await answer(egress.path, request)).startswith(b"HTTP/1.1 403 Forbidden\r\n")
            assert metrics.egress_refused._value.get() == before + 200  # every one counted
            [line] = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.sandbox.proxy"]
            shown = "evil\\x1b\\x07" + "x" * (proxy.MAX_HOST_CHARS - 12) + "[...]"  # a DNS name's length at most
            assert line == f"egress refused: {shown}:443 is not in runtime.allow_hosts"

            await answer(egress.path, b"CONNECT other.example:443 HTTP/1.1\r\n\r\n")
            egress._throttle.interval_s = 0.0  # a minute later
            await answer(egress.path, request)
        lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.sandbox.proxy"]
        assert lines[1] == "egress refused: other.example:443 is not in runtime.allow_hosts"
        assert lines[2].endswith(" is not in runtime.allow_hosts (199 more since the last such line)")
        assert len(lines) == 3
    finally:
        await egress.close()


async def test_the_throttle_keeps_a_bounded_number_of_agent_chosen_keys() -> None:
    throttle = relay.Throttle()
    logged = [throttle.admit(f"host-{n}") for n in range(1000)]
    assert logged[: relay.THROTTLE_KEYS] == [0] * relay.THROTTLE_KEYS
    assert logged[relay.THROTTLE_KEYS:] == [0] + [None] * (1000 - relay.THROTTLE_KEYS - 1)  # one line for the rest
    assert len(throttle._seen) == relay.THROTTLE_KEYS + 1


async def test_the_confined_program_gets_a_modest_descriptor_limit(bwrap: str, tmp_path: Path) -> None:
    sandbox = confined(tmp_path)
    note = tmp_path / "agent-files" / "nofile"
    code = "import resource, sys; open(sys.argv[1], 'w').write(repr(resource.getrlimit(resource.RLIMIT_NOFILE)))"
    try:
        await runtime((sys.executable, "-c", code, str(note)), sandbox, tmp_path).run(a_run())
    finally:
        await sandbox.close()
    assert note.read_text() == repr((inside.MAX_FILES, inside.MAX_FILES))


# Opens CONNECTIONS connections to the Agent server and notes how many were answered 503 and ended,
# once that is all but the cap; then holds the rest until stopped.
CONFINED_CLIENT = """
import os, select, socket, sys, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["AGENT_SERVER_URL"])
count, expected, note = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pending = [socket.create_connection((url.hostname, url.port)) for _ in range(count)]
refused = []
while len(refused) < expected:
    readable, _, _ = select.select(pending, [], [], 300)
    for client in readable:
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        refused.append(answer)
        pending.remove(client)
        client.close()
open(note, "w").write("%d %d" % (len(refused), sum(a.startswith(b"HTTP/1.1 503 ") for a in refused)))
time.sleep(600)
"""


async def test_a_confined_agent_opening_connections_without_end_is_refused_past_the_cap(
    bwrap: str, tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "agent-files").mkdir()
    settings = config.Settings(
        token_ttl_ms=1, runtime_sandbox="bubblewrap", runtime_workdir=tmp_path / "workspace",
        runtime_sandbox_rw=(tmp_path / "agent-files",),
    )
    sandbox = choose.choose(settings, config.Address("127.0.0.1", upstream.port))
    assert isinstance(sandbox, Sandbox)
    note = tmp_path / "agent-files" / "refused"
    count = relay.MAX_CONNECTIONS + PAST
    argv = (sys.executable, "-c", CONFINED_CLIENT, str(count), str(PAST), str(note))
    before = descriptors()
    running = asyncio.create_task(runtime(argv, sandbox, tmp_path).run(a_run()))
    try:
        with caplog.at_level(logging.INFO, logger="agent_gateway.sandbox"):
            await until(lambda: note.exists() and note.read_text())
            await until(lambda: upstream.accepted == relay.MAX_CONNECTIONS)
        assert note.read_text() == f"{PAST} {PAST}"
        [end] = [end for end in sandbox._ends if isinstance(end, Relay)]
        assert end.connections() == relay.MAX_CONNECTIONS
        # The relay's two for each relayed connection, the upstream's one, the program's pipes.
        assert descriptors() - before <= 3 * relay.MAX_CONNECTIONS + SLACK
        assert len([r for r in caplog.records if getattr(r, "action", None) == "sandbox_relay_refused"]) == 1
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await sandbox.close()
