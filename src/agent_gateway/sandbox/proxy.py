"""The sandbox's only way out: an HTTP proxy that lets through the hosts of ``runtime.allow_hosts``.

The agent gets it as ``HTTPS_PROXY``/``HTTP_PROXY``; it tunnels ``CONNECT
host:port`` (HTTPS) and forwards plain ``http://`` requests (a local model
server, say), and refuses, with 403, every ``host:port`` not listed, and a
listed name that resolves to a loopback, link-local, private or otherwise
non-public address unless that address and port are listed themselves (so a
listed name cannot be pointed at the gateway's own listeners or the database).
It connects to the address it checked, never resolving twice. A refusal is
logged with the host only and counted in ``agent_gateway_sandbox_egress_refused``.

Why not a library: the maintained Python proxies (proxy.py, mitmproxy) are
whole servers with their own process and thread models and plugin systems;
neither checks the addresses a name resolves to, so the check would be a
plugin of ours either way, larger than this module, and they could not run as
a task of the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from agent_gateway import errors
from agent_gateway.addresses import is_public
from agent_gateway.config import Address
from agent_gateway.ops import metrics
from agent_gateway.sandbox.relay import splice

# A request head (request line and headers) longer than this is refused.
MAX_HEAD_BYTES = 64 * 1024
# How long the proxy waits for a request head, and for the upstream to accept.
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")

logger = logging.getLogger(__name__)


class EgressRefused(errors.GatewayError):
    """The agent's request may not go out; the message says why (and names the host only)."""


class EgressProxy:
    """The proxy on the Unix socket ``path`` (bound into the sandbox), for the ``allowed`` addresses."""

    def __init__(self, path: str, allowed: Iterable[Address]) -> None:
        self.path = path
        self.allowed = {(address.host.lower(), address.port) for address in allowed}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=MAX_HEAD_BYTES)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, target, version, headers = _parse(head)
            host, port = _destination(method, target)
            upstream = await self._connect(host, port)
        except EgressRefused as refused:
            logger.warning("egress refused: %s", refused, extra={"action": "egress_refused"})
            metrics.egress_refused.inc()
            await _answer(writer, b"403 Forbidden", str(refused))
            return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, OSError):
            await _answer(writer, b"400 Bad Request", "not an HTTP proxy request")
            return
        if method == b"CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream[1].write(_origin_form(method, target, version, headers))
        await splice((reader, writer), upstream)

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host:port`` if it is allowed, to an address that was checked."""
        if (host.lower(), port) not in self.allowed:
            raise EgressRefused(f"{host}:{port} is not in runtime.allow_hosts")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise EgressRefused(f"{host} does not resolve") from None
        addresses = [info[4][0] for info in infos]
        for address in addresses:
            if not is_public(address) and (address.lower(), port) not in self.allowed:
                raise EgressRefused(f"{host} resolves to the non-public address {address}, which is not listed itself")
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(addresses[0], port)
        except (OSError, TimeoutError):
            raise EgressRefused(f"{host}:{port} does not answer") from None


def _parse(head: bytes) -> tuple[bytes, bytes, bytes, list[bytes]]:
    line, *headers = head[:-4].split(b"\r\n")
    method, target, version = line.split(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ValueError("not HTTP/1")
    return method.upper(), target, version, headers


def _destination(method: bytes, target: bytes) -> tuple[str, int]:
    """The ``host, port`` a request goes to: CONNECT's authority, or a plain request's absolute URL."""
    if method == b"CONNECT":
        url = urlsplit("//" + target.decode("ascii"))
        default = 443
    else:
        url = urlsplit(target.decode("ascii"))
        if url.scheme != "http":
            raise EgressRefused("only plain HTTP is forwarded; HTTPS goes through CONNECT")
        default = 80
    if not url.hostname:
        raise ValueError("no host")
    return url.hostname, url.port or default


def _origin_form(method: bytes, target: bytes, version: bytes, headers: list[bytes]) -> bytes:
    """The request as the upstream expects it: its path only, and one request per connection."""
    url = urlsplit(target.decode("ascii"))
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [header for header in headers if header.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    return b"\r\n".join([b"%s %s %s" % (method, path.encode(), version), *kept, b"Connection: close", b"", b""])


async def _answer(writer: asyncio.StreamWriter, status: bytes, reason: str) -> None:
    body = reason.encode() + b"\n"
    writer.write(
        b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (status, len(body), body)
    )
    with contextlib.suppress(OSError, ConnectionError):
        await writer.drain()
    writer.close()
