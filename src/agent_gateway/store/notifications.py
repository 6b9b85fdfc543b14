"""Wake-ups after commit: in this process, and across processes on PostgreSQL.

A writer calls ``engine.notify(conn, channel)`` inside its transaction; once
the transaction commits, every :class:`Subscription` on that channel wakes.
On PostgreSQL the transaction also sends ``NOTIFY agent_gateway, '<origin>
<channel>'`` (delivered only if it commits), and every gateway process listens
on a dedicated connection, so a Signal emitted or a Schedule written by any
process wakes the worker and schedulers of all of them. The origin names the
sending :class:`~agent_gateway.store.engine.Store`, whose listener skips its
own: those subscribers were woken at commit already, and a second wake-up
would cost each of them a second read (a Message stream, one per Message).
Nor is a NOTIFY sent when no other process listens (:data:`PG_NOTIFY`): a
notifying commit holds the database's notification lock until it is durable,
so that notifying commits never share a disk flush. Wake-ups only accelerate: each
loop also sweeps on a timer, and a listener that (re)connects wakes every
channel once, so a notification lost while the database restarted costs at
most one sweep.

On SQLite the processes of one deployment (``serve``'s HTTP workers, and CLI
commands run beside it) send the channel name as a datagram to an abstract
Unix socket named after the database file, where the process running the
loops listens; that process sends none (its subscribers were woken at commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
from collections import defaultdict

import asyncpg

from agent_gateway.store.unavailable import CONNECTION_LOST

logger = logging.getLogger(__name__)

PG_CHANNEL = "agent_gateway"
# A statement's NOTIFY of its payloads (:func:`pg_payload`, on :data:`PG_CHANNEL`), sent only when
# a process other than the sender's listens (the function: migration 0019); its parameters
# ``channel`` and ``payloads`` (none: nothing sent).
PG_NOTIFY = "agent_gateway_notify(:channel, CAST(:payloads AS text[]))"
# A process registering its listener waits this long at most for the notifiers before it (whose
# commits it must see when it sweeps), then tries again: one of them may wait for a row another
# holds, and that one waits behind the registration (the notifiers share the lock it takes alone).
REGISTER_LOCK_TIMEOUT = "100ms"
RECONNECT_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)
LIVENESS_CHECK_S = 2.0


class Subscription:
    """A waiter on one channel: ``await wait(timeout)`` returns early when woken."""

    __slots__ = ("_event", "_woken")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._woken = False

    def wake(self) -> None:
        self._woken = True
        self._event.set()

    def nudge(self) -> None:
        """End the current wait as a timeout would: the waiter has something else to do."""
        self._event.set()

    async def wait(self, timeout: float | None) -> bool:
        """Wait until woken, nudged or ``timeout`` seconds (None: no limit); True when woken. Clears the wake-up."""
        # A zero timeout would expire before the wait looks, report a timeout and
        # then clear the wake-up: a poll must never lose one.
        if not self._event.is_set():
            if timeout is None:
                await self._event.wait()
            else:
                # asyncio.timeout, not wait_for: no task per wait.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._event.wait()
        woken, self._woken = self._woken, False
        self._event.clear()
        return woken


class Notifier:
    """Fans a channel's wake-up out to its subscribers in this process."""

    def __init__(self) -> None:
        self._subscriptions: defaultdict[str, set[Subscription]] = defaultdict(set)

    def subscribe(self, channel: str) -> Subscription:
        subscription = Subscription()
        self._subscriptions[channel].add(subscription)
        return subscription

    def unsubscribe(self, channel: str, subscription: Subscription) -> None:
        self._subscriptions[channel].discard(subscription)

    def publish(self, channel: str) -> None:
        for subscription in self._subscriptions.get(channel, ()):
            subscription.wake()

    def publish_all(self) -> None:
        for channel in list(self._subscriptions):
            self.publish(channel)


def pg_payload(origin: str, channel: str) -> str:
    """The NOTIFY payload that wakes ``channel`` in every process but ``origin``'s."""
    return f"{origin} {channel}"


# Rows whose connection is gone cost a NOTIFY for nobody, nothing more: no lock needed to drop them.
_PRUNE = "DELETE FROM notification_listeners WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)"


class PostgresListener:
    """LISTEN on a dedicated connection, reconnecting with back-off until stopped."""

    def __init__(self, dsn: str, notifier: Notifier, origin: str) -> None:
        self.dsn = dsn
        self.notifier = notifier
        self.origin = origin
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="postgres listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _on_notification(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        origin, _, channel = payload.partition(" ")
        if origin != self.origin:
            self.notifier.publish(channel)

    async def _register(self, conn: asyncpg.Connection) -> None:
        """Have the notifiers send to this connection from now on (see :data:`PG_NOTIFY`)."""
        while True:
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{REGISTER_LOCK_TIMEOUT}'")
                    await conn.execute("SELECT agent_gateway_listen($1)", self.origin)
                return
            except asyncpg.LockNotAvailableError:
                await asyncio.sleep(0.01)

    async def _run(self) -> None:
        failures = 0
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(self.dsn, timeout=10)
                await conn.add_listener(PG_CHANNEL, self._on_notification)
                await self._register(conn)
                if failures:
                    logger.info("notification listener reconnected", extra={"action": "listener_reconnected"})
                failures = 0
                # Whatever was notified while nobody listened (or sent no NOTIFY, as nobody
                # else was registered) is picked up by one sweep.
                self.notifier.publish_all()
                while not conn.is_closed():
                    await asyncio.sleep(LIVENESS_CHECK_S)
                    # Also the check that the connection lives: the rows of listeners gone (a
                    # process killed), which would have every notifier send for nobody.
                    await conn.execute(_PRUNE)
            except asyncio.CancelledError:
                raise
            except CONNECTION_LOST as exc:
                delay = RECONNECT_DELAYS_S[min(failures, len(RECONNECT_DELAYS_S) - 1)]
                failures += 1
                logger.warning(
                    "notification listener lost the database (%s); retrying in %.1fs",
                    type(exc).__name__,
                    delay,
                    extra={"action": "listener_lost"},
                )
                await asyncio.sleep(delay)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()


def sqlite_address(database: str) -> bytes:
    """The abstract Unix socket address of one SQLite database file's listener."""
    digest = hashlib.sha256(os.path.realpath(database).encode()).hexdigest()[:32]
    return b"\0agent-gateway/" + digest.encode()


class SqliteSender:
    """Tells the listening process of a SQLite deployment that a channel was written."""

    def __init__(self, address: bytes) -> None:
        self.address = address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def send(self, channel: str) -> None:
        try:
            self._socket.sendto(channel.encode(), self.address)
        except OSError:
            pass  # nobody listens, or the queue is full: the loops' sweep covers it

    def close(self) -> None:
        self._socket.close()


class SqliteListener:
    """Receives :class:`SqliteSender` datagrams and wakes this process's subscribers."""

    def __init__(self, address: bytes, notifier: Notifier) -> None:
        self.address = address
        self.notifier = notifier
        self._socket: socket.socket | None = None

    def start(self) -> bool:
        """Listen; False when another process of this deployment already does (only one runs the loops)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.address)
        except OSError:
            sock.close()
            return False
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)
        self._socket = sock
        return True

    def _receive(self) -> None:
        assert self._socket is not None
        while True:
            try:
                channel = self._socket.recv(256)
            except (BlockingIOError, InterruptedError):
                return
            self.notifier.publish(channel.decode(errors="replace"))

    async def stop(self) -> None:
        if self._socket is not None:
            asyncio.get_running_loop().remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None
