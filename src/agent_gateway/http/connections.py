"""What each server does at the connection level, below the apps: limits, timeouts, error bodies.

uvicorn's httptools protocol, extended (the right depth: no route can get these
wrong). uvicorn closes an idle keep-alive connection after a while, but nothing
else: a connection that never sends a request, or sends its headers one line
every few seconds, stays open for ever, any number of them, until the process
has no descriptor left and both servers reset every request. So each
:class:`Protocol`:

- refuses a connection past its server's cap (``503`` with the JSON error
  body, then closed) without reading it;
- closes a connection whose request headers are not complete within
  ``header_timeout_s`` of the connection opening or of the previous response
  (a sweep once a second, run by the server, finds them: no timer per request);
- answers ``408`` and closes a connection whose request body is not complete
  within ``body_timeout_s`` of its headers (the same sweep): a client sending
  one byte every few seconds, or a ``Content-Length`` and nothing, holds no
  connection for long, authenticated or not;
- answers ``431`` to request headers over ``max_header_bytes`` (counted while
  they arrive, so a 10 MB header is never buffered), ``400`` to HTTP/1.1
  without exactly one ``Host`` (RFC 9112 §3.2), and a JSON body to what the
  parser refuses (``Content-Length`` with ``Transfer-Encoding``, ...), where
  uvicorn answers ``text/plain``;
- on a server given :class:`Hosts` (the Agent server, the ops listener), refuses a request whose
  ``Host``, or ``Origin`` when it has one, names the server by a name it does not
  have (``421``, ``403``): a web page in a browser on the agent's host cannot
  reach it by DNS rebinding, nor post to it from another origin.

:func:`budget` turns the settings and the process's descriptor limit into each
server's cap; :func:`guard` makes an app's unhandled failure a JSON ``500``
rather than uvicorn's ``text/plain`` one.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import logging
import re
import resource
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agent_gateway.http import errors as http_errors

logger = logging.getLogger(__name__)

# Descriptors neither server may take: the database pools (SQLite keeps up to 20
# connections, each with its file and WAL; PostgreSQL up to 21 sockets), the agent
# processes' pipes, the listeners, log files and the interpreter's own; and what the
# confined agent can make the gateway hold (``serving`` adds the sandbox's share).
RESERVED_DESCRIPTORS = 256
# When descriptors are short, the Agent server may take at most this share of what is
# left: it serves one agent, the Public server serves every User.
AGENT_SHARE = 4


@dataclasses.dataclass(frozen=True)
class Limits:
    """One server's connection limits."""

    max_connections: int
    header_timeout_s: float
    max_header_bytes: int
    # How long a request's body may take to arrive once its headers are complete.
    body_timeout_s: float
    # The names the server may be addressed by; None: any (see Hosts).
    hosts: Hosts | None = None


# A Host header's value (RFC 9110 §7.2): a name or an IPv4 literal, or an IPv6 literal in
# brackets, and an optional port; the host in the first group or the second.
_AUTHORITY = re.compile(r"\[([0-9A-Za-z:.%_-]+)\](?::[0-9]*)?|([^:\[\]@/\s]+)(?::[0-9]*)?")
# An Origin header's value (RFC 6454 §7): scheme "://" authority, nothing else; "null" is not one.
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(.+)")


@dataclasses.dataclass(frozen=True)
class Hosts:
    """The names a server answers to: an IP address, ``localhost``, and ``names`` (its listen
    host, the names the operator lists in ``setting``); and the origins it answers web pages of:
    a loopback address, ``localhost`` and ``names``.

    Without authentication, the Agent server trusts whoever can connect to it (and the ops
    listener shows its metrics to them); a browser on the same host can, and a web page can
    make it do so by DNS rebinding (its own name resolving, after a while, to 127.0.0.1): the
    request then carries the page's name in ``Host``. A browser sends an IP address in ``Host``
    only for a URL holding that address, that is for a page the server itself served, so any
    address passes there (a Kubernetes probe or a Prometheus scrape names the pod's). And a page
    may post to ``http://127.0.0.1:PORT`` from its own origin (a "simple" request needs no
    preflight): the browser says so in ``Origin``, which passes only with a loopback address or
    a name of the server's. A program calling the server (the agent, ``agent-gateway mcp``)
    sends the name it connected to and no ``Origin``. Ports are not compared: the sandbox's
    relay reaches the server at another port of the sandbox's own loopback.
    """

    names: frozenset[str]
    # The setting that lists more names (``agent.allowed_hosts``), named in a refusal.
    setting: str

    @classmethod
    def of(cls, listen_host: str, allowed: Iterable[str], setting: str) -> Hosts:
        return cls(frozenset(name.lower() for name in ("localhost", listen_host, *allowed)), setting)

    def accepts(self, host: str, *, any_address: bool) -> bool:
        """Whether ``host`` is one of :attr:`names`, or an IP address: loopback, or any with ``any_address``."""
        host = host.lower()
        if host in self.names:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any_address or address.is_loopback

    def problem(self, headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        """Why a request with these headers is refused, or None. A request without ``Host``
        (HTTP/1.0) is no browser's."""
        for name, value in headers:
            if name == b"host":
                match = _AUTHORITY.fullmatch(value.decode("latin-1"))
                if match is None or not self.accepts(match.group(1) or match.group(2), any_address=True):
                    return 421, (
                        "this server answers only requests addressed to an IP address, localhost, "
                        f"its listen host or a name in {self.setting} (Host)"
                    )
            elif name == b"origin":
                origin = _ORIGIN.fullmatch(value.decode("latin-1"))
                match = _AUTHORITY.fullmatch(origin.group(1)) if origin is not None else None
                if match is None or not self.accepts(match.group(1) or match.group(2), any_address=False):
                    return 403, "requests from a web page of another origin are refused (Origin)"
        return None


@dataclasses.dataclass(frozen=True)
class Budget:
    """The caps :func:`budget` chose, and why (for the start-up log line)."""

    descriptors: int
    public: int
    agent: int
    reserved: int

    def describe(self, wanted_public: int, wanted_agent: int) -> str:
        caps = []
        for name, cap, wanted in (("Public", self.public, wanted_public), ("Agent", self.agent, wanted_agent)):
            note = "" if cap == wanted else f" (asked for {wanted}, more than the descriptors allow)"
            caps.append(f"{name} server up to {cap} connections{note}")
        return f"{self.descriptors} file descriptors: {', '.join(caps)}, {self.reserved} kept in reserve"


def raise_descriptor_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to the hard limit; return the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            logger.warning("could not raise the file descriptor limit from %d to %d", soft, target)
    return soft


def budget(descriptors: int, public: int, agent: int, reserved: int = RESERVED_DESCRIPTORS) -> Budget:
    """Each server's cap: what the settings ask, or less when the process cannot hold it.

    The servers together never take more than ``descriptors - reserved``, so a flood of
    one server cannot starve the other, the database or the agent.
    """
    available = max(descriptors - reserved, 2)
    if public + agent <= available:
        return Budget(descriptors, public, agent, reserved)
    agent_cap = max(min(agent, available // AGENT_SHARE), 1)
    return Budget(descriptors, max(min(public, available - agent_cap), 1), agent_cap, reserved)


def error_bytes(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response with the JSON error body, closing the connection."""
    body = orjson.dumps({"statusCode": status, "error": HTTPStatus(status).phrase, "message": message})
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


# The scope key holding the connection's transport.
TRANSPORT = "agent_gateway.transport"
# The scope key holding a function that takes a callable to run once the connection
# goes: a long response (a Message stream) learns of it without a task of its own
# waiting on receive().
ON_LOST = "agent_gateway.on_lost"


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`Limits` and JSON error bodies (module doc)."""

    def __init__(self, *args: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        # Bytes received towards the next request's headers; None while a request's
        # headers are complete and its body or response is under way.
        self.header_bytes: int | None = 0
        self.waiting_since = 0.0
        # When the request's headers were complete, while its body is not; None otherwise.
        self.body_since: float | None = None
        self.lost_callback: Callable[[], None] | None = None
        self.lost = False

    @classmethod
    def factory(cls, limits: Limits) -> Any:
        """What uvicorn's ``Config(http=...)`` takes: it calls it as it would the class."""
        return functools.partial(cls, limits=limits)

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            # Refused unread, so a flood costs no parsing; connection_lost needs the transport.
            self.transport = transport
            transport.write(error_bytes(503, "the server is at its connection limit; retry later"))
            transport.close()
            return
        super().connection_made(_OneWrite(transport, self.loop))
        self.waiting_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        if self.header_bytes is not None:
            self.header_bytes += len(data)
        super().data_received(data)
        if (
            self.header_bytes is not None
            and self.header_bytes > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse_now(431, f"request headers are over {self.limits.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        self._refuse_now(400, "malformed HTTP request")

    def _unsupported_upgrade_warning(self) -> None:
        pass  # the request is served as plain HTTP/1.1; two log lines per request a client chose are noise

    def on_headers_complete(self) -> None:
        self.header_bytes = None
        self.body_since = self.loop.time()
        # A long response (a Message stream) aborts its connection when the reader stalls.
        self.scope[TRANSPORT] = self.transport
        self.scope[ON_LOST] = self.when_lost
        problem = self._problem()
        if problem is None:
            super().on_headers_complete()
            return
        # Answered through a request cycle like any other, so a response still under
        # way on this connection (pipelining) is not interleaved with this one.
        app, self.app = self.app, _refusal(*problem)
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        self.cycle.keep_alive = False

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the connection goes (see ``ON_LOST``); at once if it has gone.

        A response starts after its route's awaits (authentication, a read): a client may
        leave before, and uvicorn then drops every write without a word, so a stream that
        was not told would write keep-alives to nobody for as long as its Token lasts.
        """
        if self.lost:
            callback()
            return
        self.lost_callback = callback

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        super().connection_lost(exc)
        callback, self.lost_callback = self.lost_callback, None
        if callback is not None:
            callback()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.header_bytes = 0
        self.body_since = None
        self.waiting_since = self.loop.time()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        now = self.loop.time()
        if self.header_bytes is not None:
            # The next request's headers are due from now: a long response (a stream)
            # did not use up their time.
            self.waiting_since = now
        elif self.body_since is not None:
            # A body not read yet: a pipelined request's, whose reading waited for this
            # response, or one the response did not need (a 401); it is due from now.
            self.body_since = now

    def expire(self, now: float) -> None:
        """Close the connection if its request's headers or body are overdue (the server's sweep calls this)."""
        if self.transport.is_closing():
            return
        if self.header_bytes is not None:
            busy = self.cycle is not None and not self.cycle.response_complete
            if not busy and now - self.waiting_since > self.limits.header_timeout_s:
                self.transport.close()
        elif (
            self.body_since is not None
            # A pipelined request's body is not read while the response before it is under way.
            and not self.pipeline
            and now - self.body_since > self.limits.body_timeout_s
        ):
            if self.cycle is not None and not self.cycle.response_started:
                # Unless a response is under way, the client is told why; what the app would
                # answer later is dropped (the transport is closing).
                message = f"the request body was not complete within {self.limits.body_timeout_s:g} s of its headers"
                self.transport.write(error_bytes(408, message))
            self.transport.close()

    def _problem(self) -> tuple[int, str] | None:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            return 431, f"request headers are over {self.limits.max_header_bytes} bytes"
        if self.parser.get_http_version() == "1.1":
            hosts = sum(1 for name, _ in self.headers if name == b"host")
            if hosts != 1:
                return 400, "an HTTP/1.1 request needs exactly one Host header"
        if self.limits.hosts is not None:
            return self.limits.hosts.problem(self.headers)
        return None

    def _refuse_now(self, status: int, message: str) -> None:
        """Answer and close at once; while a response is under way, only close."""
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(error_bytes(status, message))
        self.transport.close()


class _OneWrite:
    """A transport whose writes of one turn of the event loop leave in one ``send``.

    uvicorn writes a response's status line and headers, then its body: two
    system calls, and on loopback two wake-ups of the reader. Held until the
    loop's next turn (``call_soon``), a short response's writes go out together:
    the server's CPU per ``POST /sign`` fell from 134 to 109 µs. Everything
    else is the wrapped transport's (flow control, extra info, buffer size).
    """

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: Any, loop: Any) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def sweep(connections: Iterable[Any], now: float) -> None:
    for connection in list(connections):
        # Neither headers nor a body awaited: a response under way (thousands of open Message
        # streams) is not due.
        if not isinstance(connection, Protocol):
            continue
        if connection.header_bytes is not None or connection.body_since is not None:
            connection.expire(now)


def _refusal(status: int, message: str) -> ASGIApp:
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        await http_errors.error_response(status, message, {"Connection": "close"})(scope, receive, send)

    return refuse


def guard(app: ASGIApp) -> ASGIApp:
    """``app``, whose unhandled failure before answering is a JSON 500, not uvicorn's text."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await app(scope, receive, tracking_send)
        except Exception:
            logger.exception("internal error", extra={"action": "internal_error"})
            if started:
                raise
            await http_errors.error_response(500, "internal error")(scope, receive, send)

    return guarded
