"""One Message stream: a User's log as Server-Sent Events, from a cursor on.

Each Message is one event (``id: <seq>``, ``event: message``, ``data:`` the
Message JSON as the log read returns it). The stream subscribes to the User's
channel *before* it reads anything, then reads every row after the last
``seq`` it sent whenever it is woken: a Message committed while a read runs
wakes it again, and a row is never sent twice because reads start after the
last one sent. One User's writers are serialised (``messages.service``), so
seqs commit in order and "after the last seq sent" misses nothing.

It is pulled, not pushed: writers only wake it, so a slow reader holds no
queue anywhere. What it has written and the reader has not taken waits in the
connection's transport, whose high-water mark (64 KiB) pauses the next write:
so a page is written in pieces of at most ``PIECE_BYTES``, each once the
transport has taken the one before, and the connection of a reader that takes
nothing buffers at most about 128 KiB in this process (the kernel's socket
buffers aside), not a whole page of up to 200 Messages. A write that stays
paused for ``streams.stall_ms`` disconnects the reader, who resumes with
``Last-Event-ID``. It reads only when woken: a listener that reconnects to
PostgreSQL wakes every channel once (``store.notifications``), and on SQLite
the Hub's poll covers the other processes, so no notification is lost for
good, and 5,000 idle streams cost no reads.

While it waits it holds no task and no timer of its own (thousands wait in
one process): the connection wakes it when the reader goes
(``http.connections.ON_LOST``, instead of a task waiting on ``receive()``),
and the Hub's tick nudges it when a keep-alive or a check is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agent_gateway import jsontext
from agent_gateway.http.connections import ON_LOST, TRANSPORT
from agent_gateway.messages import service as messages
from agent_gateway.store.window import MAX_LIMIT, Window
from agent_gateway.streams.hub import Hub

logger = logging.getLogger(__name__)

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    # nginx and others buffer responses unless told not to.
    (b"x-accel-buffering", b"no"),
]
KEEP_ALIVE = b": keep-alive\n\n"
# The most one write hands the transport: its high-water mark. Smaller events go together.
PIECE_BYTES = 64 * 1024

# Whether the stream may go on: re-authenticates its caller (False ends the stream).
StillAllowed = Callable[[], Awaitable[bool]]


def event(message: messages.Message) -> bytes:
    return b"id: %d\nevent: message\ndata: %s\n\n" % (message.seq, jsontext.dumps(message.to_json()))


def pieces(page: Iterable[messages.Message]) -> Iterator[bytes]:
    """The events of ``page`` in pieces of at most ``PIECE_BYTES``: small events together, a large
    one cut (a reader takes an event however its bytes arrive). Each event is made as it is due."""
    held: list[bytes] = []
    size = 0
    for message in page:
        data = event(message)
        if held and size + len(data) > PIECE_BYTES:
            yield b"".join(held)
            held, size = [], 0
        if len(data) > PIECE_BYTES:
            view = memoryview(data)
            for start in range(0, len(data), PIECE_BYTES):
                yield bytes(view[start : start + PIECE_BYTES])
            continue
        held.append(data)
        size += len(data)
    if held:
        yield b"".join(held)


class MessageStream(Response):
    """The response of ``GET /messages/stream``, for one User from ``after`` on."""

    # None: FastAPI then describes the error answers as application/json (the route
    # describes its 200 itself), and the content type is set in HEADERS.
    media_type = None

    def __init__(
        self,
        hub: Hub,
        user_id: str,
        after: int | None,
        *,
        token_digest: str | None = None,
        still_allowed: StillAllowed | None = None,
    ) -> None:
        self.hub = hub
        self.user_id = user_id
        self.after = after
        # A password-scheme Token is checked by the Hub for all streams at once; another
        # scheme's caller is asked again by this stream (still_allowed), when the Hub's
        # tick says it is time (check_due).
        self.still_allowed = still_allowed
        # Subscribed at once, before the route returns: with no cursor, the stream holds
        # every Message committed from this moment on.
        self.subscription = hub.subscribe(user_id, token_digest)
        self.disconnected = False
        self.written_at = self.check_at = 0.0
        self.keep_alive_due = self.check_due = False
        self.status_code = 200
        self.background = None

    def tick(self, now: float, quiet_since: float) -> None:
        """The Hub's tick: a keep-alive or a check is due before the next tick (see ``streams.hub``)."""
        if self.written_at <= quiet_since:
            self.keep_alive_due = True
            self.subscription.nudge()
        if self.still_allowed is not None and self.check_at <= now + self.hub.tick_s:
            self.check_at = now + self.hub.settings.stream_auth_check_ms / 1000
            self.check_due = True
            self.subscription.nudge()

    def _lost(self) -> None:
        self.disconnected = True
        self.subscription.wake()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        write = _Writer(scope, send, self.hub.settings.stream_stall_ms / 1000)
        loop = asyncio.get_running_loop()
        try:
            # The connection tells the stream when it goes (no task waiting on receive()), at
            # once if it went while the route authenticated the caller: writes to it are dropped
            # without a word, so nothing else would end the stream.
            scope[ON_LOST](self._lost)
            last = self.after
            if last is None and not self.disconnected:
                last = await _newest_seq(self.hub, self.user_id)
            # A reader gone has nothing sent (the server drops it): the request is counted as a
            # stream like any other, and ends below.
            await write.start()
            self.written_at = loop.time()
            self.check_at = self.written_at + self.hub.settings.stream_auth_check_ms / 1000
            self.hub.follow(self)
            if await self._run(write, last or 0) and not self.disconnected:
                await write.end()
        except Exception as exc:  # the database away, say: the client reconnects with Last-Event-ID
            logger.warning("a Message stream ended early (%s)", type(exc).__name__, extra={"action": "stream_failed"})
            write.abort()
        finally:
            self.hub.unfollow(self)
            if write.aborted:
                # Returned once the server has seen the connection go, so that it takes
                # the unfinished response for a disconnection, not for an error.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        while not self.disconnected:
                            await self.subscription.wait(None)
            self.hub.unsubscribe(self.subscription)

    async def _run(self, write: _Writer, last: int) -> bool:
        """Send until the reader leaves, the caller's Token ends or the server stops; False when the reader stalled."""
        read = True  # the backlog first
        while not (self.disconnected or self.hub.closed or self.hub.token_ended(self.subscription)):
            if read:
                page = await messages.read(self.hub.store, self.user_id, Window(after=last, limit=MAX_LIMIT))
                if page:
                    for piece in pieces(page):
                        if self.disconnected:
                            return True
                        if not await self._write(write, piece):
                            return False
                    last = page[-1].seq
                    if len(page) == MAX_LIMIT:
                        continue  # more waiting: read on before sleeping
            if self.check_due:
                self.check_due = False
                if self.still_allowed is not None and not await self.still_allowed():
                    break
            if self.keep_alive_due:
                self.keep_alive_due = False
                if not await self._write(write, KEEP_ALIVE):
                    return False
            read = await self.subscription.wait(None)
        return True

    async def _write(self, write: _Writer, data: bytes) -> bool:
        self.written_at = asyncio.get_running_loop().time()
        return await write.body(data)


async def _newest_seq(hub: Hub, user_id: str) -> int:
    [newest] = await messages.read(hub.store, user_id, Window(limit=1)) or [None]
    return 0 if newest is None else newest.seq


class _Writer:
    """The response's writes; a write the reader holds up past the stall limit aborts the connection."""

    def __init__(self, scope: Scope, send: Send, stall_s: float) -> None:
        self.scope = scope
        self._send = send
        self.stall_s = stall_s
        self.aborted = False

    async def start(self) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        # Sent at once, so that a client knows the stream is open before any Message.
        await self.body(KEEP_ALIVE)

    async def body(self, data: bytes, *, more: bool = True) -> bool:
        """Write ``data``; False when the reader stalled and was disconnected."""
        message: Any = {"type": "http.response.body", "body": data, "more_body": more}
        try:
            # asyncio.timeout, not wait_for: no task per write.
            async with asyncio.timeout(self.stall_s):
                await self._send(message)
            # The server's send waits only while the transport is paused, and the connection
            # hands the transport its writes at the loop's next turn (http.connections._OneWrite):
            # one turn, so that the next write finds the transport paused if this one filled it.
            await asyncio.sleep(0)
            return True
        except TimeoutError:
            logger.info("a Message stream's reader fell behind; disconnected", extra={"action": "stream_stalled"})
            self.abort()
            return False

    async def end(self) -> None:
        await self.body(b"", more=False)

    def abort(self) -> None:
        transport = self.scope.get(TRANSPORT)
        if transport is not None:
            transport.abort()
            self.aborted = True
