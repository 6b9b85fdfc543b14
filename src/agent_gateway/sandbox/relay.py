"""The gateway's end of the sandbox's way to the Agent server: a Unix socket relayed to the Agent server's address.

The socket is bound into the sandbox, where ``inside.py`` forwards the agent's
``http://127.0.0.1:<port>`` to it. Relaying to the configured Agent server
address (rather than serving the app here) makes one design hold for every
layout: the Agent server in this process, in an HTTP process beside it
(``http.workers > 1``) or in another ``serve`` altogether (``--role worker``
on PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

BUFFER_BYTES = 65536

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
    """Copy both ways until both directions have ended, then close both connections."""
    try:
        await asyncio.gather(pipe(client[0], upstream[1]), pipe(upstream[0], client[1]))
    finally:
        for _, writer in (client, upstream):
            writer.close()


class Relay:
    """A Unix socket at ``path`` whose every connection is relayed to ``host:port``."""

    def __init__(self, path: str, host: str, port: int) -> None:
        self.path = path
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._relay, path=self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            logger.warning(
                "the sandbox could not reach the Agent server at %s:%s: %s", self.host, self.port,
                exc.strerror or exc, extra={"action": "sandbox_relay_failed"},
            )
            writer.close()
            return
        await splice((reader, writer), upstream)
