"""The egress proxy (sandbox/proxy.py) on its Unix socket, against a local upstream listed by address
(tests have no internet): allowed hosts go through, for CONNECT and plain http://; everything else is
403, logged with the host only and counted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_gateway.config import Address
from agent_gateway.ops import metrics
from agent_gateway.sandbox.proxy import EgressProxy

UPSTREAM_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream"


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A local HTTP server on 127.0.0.1 that records each request head and answers ``upstream``."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(UPSTREAM_ANSWER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], heads
    server.close()


async def through(proxy: EgressProxy, request: bytes, then: bytes = b"") -> bytes:
    """Send ``request`` to the proxy (and ``then`` once it answers a CONNECT); everything it answers."""
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(request)
    if then:
        established = await reader.readuntil(b"\r\n\r\n")
        assert established.startswith(b"HTTP/1.1 200"), established
        writer.write(then)
    answer = await asyncio.wait_for(reader.read(), 300)
    writer.close()
    return answer


@pytest.fixture
async def proxy(tmp_path: Path, upstream: tuple[int, list[bytes]]) -> AsyncIterator[EgressProxy]:
    port, _ = upstream
    proxy = EgressProxy(str(tmp_path / "proxy.sock"), [Address("127.0.0.1", port), Address("localhost", port)])
    await proxy.start()
    yield proxy
    await proxy.close()


async def test_a_listed_address_is_tunnelled_by_connect(proxy: EgressProxy, upstream: tuple[int, list[bytes]]) -> None:
    port, heads = upstream
    answer = await through(proxy, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port, b"GET /x HTTP/1.1\r\n\r\n")
    assert answer == UPSTREAM_ANSWER
    assert heads == [b"GET /x HTTP/1.1\r\n\r\n"]


async def test_a_plain_http_request_is_forwarded_in_origin_form(
    proxy: EgressProxy, upstream: tuple[int, list[bytes]]
) -> None:
    port, heads = upstream
    request = b"GET http://127.0.0.1:%d/models?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nProxy-Connection: keep-alive\r\n\r\n"
    assert await through(proxy, request % port) == UPSTREAM_ANSWER
    assert heads == [b"GET /models?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"]


@pytest.mark.parametrize(
    ("request_line", "reason"),
    [
        (b"CONNECT 127.0.0.1:{other} HTTP/1.1", b"127.0.0.1:{other} is not in runtime.allow_hosts"),
        (b"CONNECT 10.1.2.3:443 HTTP/1.1", b"10.1.2.3:443 is not in runtime.allow_hosts"),
        (b"GET http://example.org/ HTTP/1.1", b"example.org:80 is not in runtime.allow_hosts"),
        # A listed name that resolves to loopback, whose address is not listed with this port.
        (b"CONNECT localhost:{port} HTTP/1.1", b"localhost resolves to the non-public address"),
        (b"GET https://127.0.0.1:{port}/ HTTP/1.1", b"only plain HTTP is forwarded"),
    ],
)
async def test_everything_else_is_refused_logged_with_the_host_only_and_counted(
    tmp_path: Path, upstream: tuple[int, list[bytes]], request_line: bytes, reason: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, heads = upstream
    # localhost is listed by name only (its address with another port), so it resolves to an unlisted address.
    proxy = EgressProxy(str(tmp_path / "proxy.sock"), [Address("127.0.0.1", port + 1), Address("localhost", port)])
    await proxy.start()
    try:
        before = metrics.egress_refused._value.get()
        request = request_line.replace(b"{port}", b"%d" % port).replace(b"{other}", b"%d" % (port + 2))
        with caplog.at_level(logging.WARNING, logger="agent_gateway.sandbox.proxy"):
            answer = await through(proxy, request + b"\r\nAuthorization: secret-token\r\n\r\n")
    finally:
        await proxy.close()
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    expected = reason.replace(b"{port}", b"%d" % port).replace(b"{other}", b"%d" % (port + 2))
    assert expected in answer
    assert heads == []
    assert metrics.egress_refused._value.get() == before + 1
    [record] = [r for r in caplog.records if r.name == "agent_gateway.sandbox.proxy"]
    assert record.getMessage().startswith("egress refused: ")
    assert "secret-token" not in record.getMessage() and "/" not in record.getMessage().split(": ", 1)[1]


async def test_a_request_that_is_not_http_is_400(proxy: EgressProxy) -> None:
    assert (await through(proxy, b"hello\r\n\r\n")).startswith(b"HTTP/1.1 400 Bad Request\r\n")
