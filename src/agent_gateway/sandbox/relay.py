"""The gateway's end of the sandbox's way to the Agent server: a Unix socket relayed to the Agent server's address.

The socket is bound into the sandbox, where ``inside.py`` forwards the agent's
``http://127.0.0.1:<port>`` to it. Relaying to the configured Agent server
address (rather than serving the app here) makes one design hold for every
layout: the Agent server in this process, in an HTTP process beside it
(``http.workers > 1``) or in another ``serve`` altogether (``--role worker``
on PostgreSQL).

Every relayed connection costs the gateway two descriptors, and the agent
chooses how many it opens: so at most :data:`MAX_CONNECTIONS` are relayed at
once, one past it is answered ``503`` and closed, unread, and a pair ends as
soon as either side ends (:func:`splice`: a half-open pair holds nothing for
ever). Refusals are logged at most once a minute (:class:`Throttle`), with
how many there were: an agent opening connections in a loop must not fill the
log either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable

from agent_gateway.http.connections import error_bytes

BUFFER_BYTES = 65536
# Connections relayed at once. An agent has a few requests to the Agent server in flight (a
# Message stream, a call or two); each costs the gateway two descriptors, which the HTTP
# servers' budget keeps in reserve with the egress proxy's (proxy.DESCRIPTORS, serving).
MAX_CONNECTIONS = 64
# How long closing waits for its connections' tasks: a guard (they end as their ends close, at once,
# unless connecting: the proxy's connect has its own timeout).
CLOSE_WAIT_S = 10.0
# A refusal logged once per key (a cause, a host) per this long at most; the next line counts the rest.
LOG_INTERVAL_S = 60.0
# Keys a Throttle remembers at once (an agent reaches a few hosts); past it, the agent is choosing new keys
# to flood the log, and they share one.
THROTTLE_KEYS = 64

logger = logging.getLogger(__name__)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` into ``writer`` until it ends, then end ``writer``'s writing side."""
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(BUFFER_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def splice(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy both ways until either way has ended (passing its end on), then close both connections.

    Not until both have: the agent's forwarder (``inside.py``) passes an agent's
    close on as a half-close, and an upstream that never closes its own side
    (nor an agent, when the upstream has) would hold both descriptors for ever.
    HTTP clients do not half-close, and the Agent server (uvicorn) closes at a
    client's end itself.
    """
    ways = {asyncio.ensure_future(pipe(client[0], upstream[1])), asyncio.ensure_future(pipe(upstream[0], client[1]))}
    try:
        await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for way in ways:
            way.cancel()
        for _, writer in (client, upstream):
            writer.close()
        await asyncio.wait(ways)


async def close_all(connections: dict[asyncio.Task[None], list[asyncio.StreamWriter]]) -> None:
    """Close every end of ``connections`` and wait for their tasks to end (each ends with its ends)."""
    for ends in list(connections.values()):
        for end in ends:
            end.close()
    if connections:
        await asyncio.wait(set(connections), timeout=CLOSE_WAIT_S)


class Throttle:
    """At most one log line per key per :data:`LOG_INTERVAL_S`; the next one says how many were not logged.

    The keys are chosen by the agent (a host name): past :data:`THROTTLE_KEYS` of
    them at once, new keys share one entry, so the memory is bounded as well.
    """

    def __init__(self, interval_s: float = LOG_INTERVAL_S, max_keys: int = THROTTLE_KEYS) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        # key -> (when its last line was logged, how many since were not)
        self._seen: dict[Hashable, tuple[float, int]] = {}

    def admit(self, key: Hashable = None) -> int | None:
        """None when this one is not to be logged; otherwise how many with this key were not, since the last."""
        now = asyncio.get_running_loop().time()
        if key not in self._seen and len(self._seen) >= self.max_keys:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval_s}
            if len(self._seen) >= self.max_keys:
                key = _OVERFLOW
        logged, quiet = self._seen.get(key, (float("-inf"), 0))
        if now - logged < self.interval_s:
            self._seen[key] = (logged, quiet + 1)
            return None
        self._seen[key] = (now, 0)
        return quiet


_OVERFLOW = object()


def not_logged(count: int) -> str:
    """What a throttled log line adds about the ones before it that were not logged."""
    return f" ({count} more since the last such line)" if count else ""


class Relay:
    """A Unix socket at ``path`` whose connections, up to ``max_connections`` at once, are relayed to ``host:port``."""

    def __init__(self, path: str, host: str, port: int, max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        # The task of each open connection, and its ends (the agent's, and the Agent server's once
        # connected): closing them ends it. Not cancelling it: a cancelled one is an error to asyncio's server.
        self._open: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}
        self._throttle = Throttle()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._relay, path=self.path)

    async def close(self) -> None:
        """Stop accepting, and close the connections still relayed (the sandbox is ending)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await close_all(self._open)

    def connections(self) -> int:
        """How many agent connections are relayed now."""
        return len(self._open)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.max_connections:
            if (quiet := self._throttle.admit("cap")) is not None:
                logger.warning(
                    "the agent has %d connections to the Agent server open, the most allowed: refusing more%s",
                    self.max_connections, not_logged(quiet), extra={"action": "sandbox_relay_refused"},
                )
            # Refused unread: the agent reads the 503 and the end of the connection.
            writer.write(error_bytes(503, f"the agent may have {self.max_connections} connections open; retry later"))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        ends = self._open[task] = [writer]
        try:
            try:
                upstream = await asyncio.open_connection(self.host, self.port)
            except OSError as exc:
                if (quiet := self._throttle.admit("unreachable")) is not None:
                    logger.warning(
                        "the sandbox could not reach the Agent server at %s:%s: %s%s", self.host, self.port,
                        exc.strerror or exc, not_logged(quiet), extra={"action": "sandbox_relay_failed"},
                    )
                return
            ends.append(upstream[1])
            await splice((reader, writer), upstream)
        finally:
            del self._open[task]
            writer.close()
