"""The sandbox's only way out: an HTTP proxy that lets through the hosts of ``runtime.allow_hosts``.

The agent gets it as ``HTTPS_PROXY``/``HTTP_PROXY``; it tunnels ``CONNECT
host:port`` (HTTPS) and forwards plain ``http://`` requests (a local model
server, say), and refuses, with 403, every ``host:port`` not listed, and a
listed name that resolves to a loopback, link-local, private or otherwise
non-public address unless that address and port are listed themselves (so a
listed name cannot be pointed at the gateway's own listeners or the database).
It connects to the address it checked, never resolving twice. A refusal is
counted in ``agent_gateway_sandbox_egress_refused`` and logged with the host
only, cut to a DNS name's length with anything unusual escaped (the agent
chooses it, up to the 64 KiB of a request head), and at most once a minute per
host (``relay.Throttle``). Like the relay, it tunnels at most
:data:`MAX_CONNECTIONS` at once and answers ``503`` past it.

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
from agent_gateway.sandbox import relay
from agent_gateway.sandbox.relay import Throttle, close_all, not_logged, splice

# A request head (request line and headers) longer than this is refused.
MAX_HEAD_BYTES = 64 * 1024
# How long the proxy waits for a request head, and for the upstream to accept.
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
# Connections through the proxy at once: an agent's model calls and fetches are a handful in flight;
# each costs the gateway two descriptors (see relay.MAX_CONNECTIONS).
MAX_CONNECTIONS = 32
# The most descriptors a confined agent can make the gateway hold: two for each connection
# relayed to the Agent server or through this proxy (kept out of the HTTP servers' budget).
DESCRIPTORS = 2 * (relay.MAX_CONNECTIONS + MAX_CONNECTIONS)
# The most of a host name a refusal shows: a DNS name's longest.
MAX_HOST_CHARS = 253
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:%[]")
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")

logger = logging.getLogger(__name__)


class EgressRefused(errors.GatewayError):
    """The agent's request may not go out; the message says why (and names the host only, as :func:`shown`)."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host  # the host named, as shown: what refusals are throttled by


class EgressProxy:
    """The proxy on the Unix socket ``path`` (bound into the sandbox), for the ``allowed`` addresses."""

    def __init__(self, path: str, allowed: Iterable[Address], max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.allowed = {(address.host.lower(), address.port) for address in allowed}
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        # The task of each open connection, and its ends (the agent's, and the upstream's once connected):
        # closing them ends it (see relay.Relay).
        self._open: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}
        self._throttle = Throttle()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=MAX_HEAD_BYTES)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        await close_all(self._open)

    def connections(self) -> int:
        """How many agent connections are open through the proxy now."""
        return len(self._open)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.max_connections:
            if (quiet := self._throttle.admit("cap")) is not None:
                logger.warning(
                    "the agent has %d connections through the egress proxy open, the most allowed: refusing more%s",
                    self.max_connections, not_logged(quiet), extra={"action": "sandbox_proxy_refused"},
                )
            # Refused unread (a Unix socket: the agent still reads the answer).
            reason = f"the agent may have {self.max_connections} connections open"
            await _answer(writer, b"503 Service Unavailable", reason)
            return
        task = asyncio.current_task()
        assert task is not None
        ends = self._open[task] = [writer]
        try:
            await self._proxy(reader, writer, ends)
        finally:
            del self._open[task]
            writer.close()

    async def _proxy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: list[asyncio.StreamWriter]
    ) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, target, version, headers = _parse(head)
            host, port = _destination(method, target)
            upstream = await self._connect(host, port)
        except EgressRefused as refused:
            if (quiet := self._throttle.admit(refused.host)) is not None:
                logger.warning("egress refused: %s%s", refused, not_logged(quiet), extra={"action": "egress_refused"})
            metrics.egress_refused.inc()
            await _answer(writer, b"403 Forbidden", str(refused))
            return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, OSError):
            await _answer(writer, b"400 Bad Request", "not an HTTP proxy request")
            return
        ends.append(upstream[1])
        if method == b"CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream[1].write(_origin_form(method, target, version, headers))
        await splice((reader, writer), upstream)

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host:port`` if it is allowed, to an address that was checked."""
        named = shown(host)
        if (host.lower(), port) not in self.allowed:
            raise EgressRefused(f"{named}:{port} is not in runtime.allow_hosts", named)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise EgressRefused(f"{named} does not resolve", named) from None
        addresses = [info[4][0] for info in infos]
        for address in addresses:
            if not is_public(address) and (address.lower(), port) not in self.allowed:
                raise EgressRefused(
                    f"{named} resolves to the non-public address {address}, which is not listed itself", named
                )
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(addresses[0], port)
        except (OSError, TimeoutError):
            raise EgressRefused(f"{named}:{port} does not answer", named) from None


def shown(host: str) -> str:
    """``host`` as a log line may hold it: what a host name is made of, anything else escaped (``\\x..``),
    cut at :data:`MAX_HOST_CHARS` (``[...]`` then)."""
    escaped = "".join(c if c in _HOST_CHARS else f"\\x{ord(c):02x}" for c in host[: MAX_HOST_CHARS + 1])
    return escaped if len(escaped) <= MAX_HOST_CHARS else escaped[:MAX_HOST_CHARS] + "[...]"


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
