"""The database: one async engine for SQLite or PostgreSQL, and transactions.

Services take an open connection (``conn``) that is inside a transaction the
caller owns; they never commit. ``Store.transaction()`` is the usual way to
get one. Work that must only happen once a transaction is durable (waking the
Signal Worker, re-arming the Scheduler) is registered with :func:`on_commit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import await_

from agent_gateway.store import direct, notifications, sqlite, wal

SQLITE_PRAGMAS = ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL")
# SQLite connections kept open per process: opening one runs on the loop, and every
# request beyond the pool's size would open and close one. PostgreSQL keeps
# SQLAlchemy's default (5, and 10 more while busy), which bounds what each of several
# gateway processes takes of the server's max_connections.
SQLITE_POOL_SIZE = 20
# Every channel in one round trip (a batch of Messages wakes the streams of each User).
_PG_NOTIFY = sa.text(f"SELECT {notifications.PG_NOTIFY}")
_ON_COMMIT = "agent_gateway.on_commit"
_STORE = "agent_gateway.store"
_CHANNELS = "agent_gateway.channels"
_CARRIED = "agent_gateway.carried"


@functools.lru_cache(maxsize=16)
def _carrying(with_clauses: tuple[str, ...]) -> direct.Query:
    """The NOTIFY statement that also writes the rows of these WITH clauses."""
    return direct.Query(sa.text(f"WITH {', '.join(with_clauses)} SELECT {notifications.PG_NOTIFY}"))


def async_url(url: str) -> str:
    """Map the configured URL to the async dialect's: aiosqlite (driven by :mod:`.sqlite`) or asyncpg."""
    url = re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+asyncpg://", url)
    return re.sub(r"^sqlite(\+\w+)?://", "sqlite+aiosqlite://", url)


def libpq_dsn(url: str) -> str:
    """The URL as asyncpg.connect takes it (no SQLAlchemy driver suffix)."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def create_engine(
    url: str, *, checkpointer: wal.Checkpointer | None = None, busy_timeout_s: float = sqlite.BUSY_TIMEOUT_S
) -> AsyncEngine:
    """The engine of ``url``; on SQLite with ``checkpointer``, its commits leave WAL checkpoints to that,
    and a statement waits at most ``busy_timeout_s`` for another process's write lock."""
    options: dict[str, object] = {}
    if url.startswith("sqlite"):
        database = sa.make_url(url).database or ":memory:"
        options["async_creator"] = functools.partial(
            sqlite.connect,
            database,
            pragmas=SQLITE_PRAGMAS if checkpointer is None else (*SQLITE_PRAGMAS, wal.PRAGMA),
            committed=None if checkpointer is None else checkpointer.committed,
            busy_timeout_s=busy_timeout_s,
        )
        if database != ":memory:":  # an in-memory database is one connection, or each would see its own
            options["pool_size"] = SQLITE_POOL_SIZE
            # The connection returned last first: a SQLite connection drops its whole page cache
            # when another one has written since its last transaction, so writers that took the
            # pool's connections in turn (its default) each read every page again (a write
            # transaction 25-30 % dearer in a throwaway test); taken last-in first-out, the
            # process's writers keep to one connection while nothing else holds it.
            options["pool_use_lifo"] = True
    engine = create_async_engine(
        async_url(url),
        # Every Store transaction ends in COMMIT or ROLLBACK, so the pool need not reset.
        pool_reset_on_return=None,
        # No pre-ping (a round trip per request): a connection found dead fails its one
        # request with a 503 and makes the pool replace every connection older than it.
        # A failed statement's error, which may be logged, must not carry its values
        # (Statement text, digests).
        hide_parameters=True,
        **options,
    )
    if url.startswith("sqlite"):
        _begin_sqlite_writers_immediately(engine)
    return engine


def _begin_sqlite_writers_immediately(engine: AsyncEngine) -> None:
    # A transaction that begins as a reader and then writes can deadlock with
    # another such writer; writing transactions take the write lock up front.
    # BEGIN goes straight to the driver: through SQLAlchemy it costs as much as a query.
    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        immediate = conn.get_execution_options().get("write", True)
        await_(conn.connection.driver_connection.begin(immediate=immediate))


def on_commit(conn: AsyncConnection | direct.Alone, callback: Callable[[], None]) -> None:
    """Call ``callback`` once the transaction ``conn`` is in has committed.

    Only transactions opened by :class:`Store` run callbacks; in a transaction
    the caller opened on the engine directly they are dropped, and the loops'
    sweep interval picks the work up instead.
    """
    conn.info.setdefault(_ON_COMMIT, []).append(callback)


def notify(conn: AsyncConnection, channel: str) -> None:
    """Wake every :meth:`Store.subscribe` waiter on ``channel``, in any process, once ``conn`` commits."""
    store = conn.info.get(_STORE)
    if store is not None:
        conn.info.setdefault(_CHANNELS, set()).add(channel)
        on_commit(conn, lambda: store.publish(channel))


@dataclasses.dataclass(frozen=True)
class Carried:
    """Rows a PostgreSQL transaction's NOTIFY statement writes: a data-modifying WITH clause
    (named, so it stands beside the others) and how it binds the rows (see :func:`carry`)."""

    with_clause: str
    params: Callable[[list[Any]], Mapping[str, Any]]


def carry(conn: AsyncConnection, carried: Carried, rows: Sequence[Any], channel: str) -> bool:
    """On PostgreSQL, have the statement that sends this transaction's NOTIFY (its last, before
    COMMIT) write ``rows`` too, and wake ``channel`` once it commits: a round trip less than a
    statement of their own. False when they must be written now: on SQLite, whose statements
    cost no round trip, or outside a :class:`Store`'s transaction (which sends no NOTIFY)."""
    if conn.dialect.name != "postgresql" or conn.info.get(_STORE) is None:
        return False
    conn.info.setdefault(_CARRIED, {}).setdefault(carried, []).extend(rows)
    notify(conn, channel)
    return True


def notify_in_statement(conn: AsyncConnection | direct.Alone, channel: str) -> str | None:
    """:func:`notify` for a PostgreSQL writer that sends the NOTIFY itself, inside one of its
    own statements (:data:`notifications.PG_NOTIFY` of this payload among its ``payloads``), to spare the
    commit a statement: this process's subscribers are woken once ``conn`` commits, and the
    payload wakes the other processes'. None outside a Store's transaction (no wake-up)."""
    store = conn.info.get(_STORE)
    if store is None:
        return None
    on_commit(conn, lambda: store.notifier.publish(channel))
    return notifications.pg_payload(store.origin, channel)


def webhook_urls(conn: AsyncConnection | direct.Alone, event: str) -> tuple[str, ...]:
    """The webhook endpoints subscribed to ``event`` in the :class:`Store` whose transaction
    ``conn`` is in (see ``webhooks.outbox``); none outside a Store's transaction."""
    store = conn.info.get(_STORE)
    return () if store is None else store.webhook_urls.get(event, ())


def watched(conn: AsyncConnection | direct.Alone, channel: str) -> bool:
    """Whether a loop waits for each append to a log (its ``channel``: the Decision log's, the Run
    ledger's) in the :class:`Store` whose transaction ``conn`` is in (the witness collector);
    False outside a Store's transaction."""
    store = conn.info.get(_STORE)
    return store is not None and channel in store.watched


def channels(conn: AsyncConnection) -> frozenset[str]:
    """The chat channels served by the :class:`Store` whose transaction ``conn`` is in (see
    ``channels.outbox``); none outside a Store's transaction."""
    store = conn.info.get(_STORE)
    return frozenset() if store is None else store.channels


@contextlib.contextmanager
def committing(conn: direct.Alone, store: Store) -> Iterator[direct.Alone]:
    """``conn``, whose statements each commit alone, serving one writer's statement as a
    :class:`Store`'s transaction serves its writers: :func:`on_commit`, :func:`notify_in_statement`,
    :func:`watched` and :func:`webhook_urls` answer for ``store``, and the callbacks run once the
    block ends without an error (its statement committed). What acts at a COMMIT (:func:`notify`,
    :func:`carry`) has none to act at here."""
    conn.info[_STORE] = store
    try:
        yield conn
        if _CHANNELS in conn.info or _CARRIED in conn.info:
            raise RuntimeError("notify and carry act at a COMMIT: a statement alone sends its own NOTIFY")
        callbacks = conn.info.get(_ON_COMMIT, ())
    finally:
        conn.info.clear()
    for callback in callbacks:
        callback()


class Store:
    """The gateway's database."""

    def __init__(self, url: str, *, busy_timeout_s: float = sqlite.BUSY_TIMEOUT_S) -> None:
        self.url = url
        database = sa.make_url(async_url(url)).database
        on_disk = url.startswith("sqlite") and database and database != ":memory:"
        # Checkpoints off the event loop, not inside the commits of requests (store.wal).
        self._checkpointer = wal.Checkpointer(database) if on_disk else None
        self.engine = create_engine(url, checkpointer=self._checkpointer, busy_timeout_s=busy_timeout_s)
        # Execution options set once here: setting them per connection costs every request.
        if self.dialect == "postgresql":
            self._reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        else:
            self._reader = self.engine.execution_options(write=False)
        self.notifier = notifications.Notifier()
        # Event name -> the URLs of the [[webhooks]] endpoints subscribed to it; the gateway
        # sets it. Every writer of an event reads it (webhook_urls): no endpoint, no outbox row.
        self.webhook_urls: Mapping[str, tuple[str, ...]] = {}
        # The chat channels this deployment serves ([channels.*]); the gateway sets it. An outbound
        # Message's writer reads it (channels): no channel, no channel outbox query at all.
        self.channels: frozenset[str] = frozenset()
        # The logs whose appends wake a loop (the witness collector, transparency.collector), by
        # their channels; the gateway sets it. Unwatched, an append sends no wake-up at all (no
        # NOTIFY on PostgreSQL).
        self.watched: frozenset[str] = frozenset()
        # Names this Store in its NOTIFY payloads (notifications.pg_payload).
        self.origin = secrets.token_hex(8)
        self._sqlite_writer = asyncio.Lock() if self.dialect == "sqlite" else None
        self._listener: notifications.PostgresListener | notifications.SqliteListener | None = None
        self._sender: notifications.SqliteSender | None = None
        if on_disk:
            self._sender = notifications.SqliteSender(notifications.sqlite_address(database))
        self._direct: direct.Reader | None = None
        if on_disk or self.dialect == "postgresql":
            self._direct = direct.Reader(
                self.engine.dialect,
                sqlite_database=database if on_disk else None,
                postgres_dsn=libpq_dsn(url) if self.dialect == "postgresql" else None,
            )

    def subscribe(self, channel: str) -> notifications.Subscription:
        """A new waiter on ``channel``; release it with :meth:`unsubscribe`."""
        return self.notifier.subscribe(channel)

    def unsubscribe(self, channel: str, subscription: notifications.Subscription) -> None:
        self.notifier.unsubscribe(channel, subscription)

    def publish(self, channel: str) -> None:
        """Wake ``channel``'s subscribers here and in the deployment's other processes."""
        self.notifier.publish(channel)
        if self._sender is not None:
            self._sender.send(channel)  # on PostgreSQL the transaction's NOTIFY does this

    def listen(self) -> None:
        """Receive other processes' wake-ups too (the process running the loops calls this)."""
        if self._listener is not None:
            return
        if self.dialect == "postgresql":
            self._listener = notifications.PostgresListener(libpq_dsn(self.url), self.notifier, self.origin)
            self._listener.start()
        elif self._sender is not None:
            self._listener = notifications.SqliteListener(self._sender.address, self.notifier)
            if self._listener.start():
                # The datagrams' one receiver is this process, whose subscribers publish wakes
                # already: sending them too would only wake them twice, a system call each way
                # per commit (a tenth of a webhook outbox row's cost on SQLite).
                self._sender.close()
                self._sender = None

    def pool_usage(self) -> tuple[int, int]:
        """Connections checked out of the engine's pool, and tasks waiting for one (for /metrics)."""
        pool = self.engine.pool
        in_use = pool.checkedout() if isinstance(pool, sa.pool.QueuePool) else 0
        # The async pool's queue is an asyncio.Queue; its getters are the waiting tasks.
        getters = getattr(getattr(getattr(pool, "_pool", None), "_queue", None), "_getters", ())
        return in_use, sum(1 for getter in getters if not getter.done())

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A writing transaction; commits when the block ends, rolls back on error."""
        if self._sqlite_writer is None:
            async with self._transaction() as conn:
                yield conn
            return
        # SQLite admits one writer at a time, and a writer that finds the lock taken
        # polls for it (see store.sqlite) instead of being woken when it frees: queue
        # this process's writers here, in order, so that only other processes poll.
        async with self._sqlite_writer, self._transaction() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[AsyncConnection | direct.Alone]:
        """A connection whose statements each commit on their own, with no BEGIN or COMMIT: for
        a writer whose work is one statement (which is atomic alone), the transaction's fixed
        cost less. Its statements go straight to the driver (:func:`.direct.run`): on PostgreSQL
        on the reads' connections (:class:`.direct.Alone`); on SQLite they take their turn behind
        this process's transactions, as a transaction does."""
        if self._sqlite_writer is None:
            assert self._direct is not None  # PostgreSQL always has its reads' connections
            async with self._direct.alone(self.engine.sync_engine) as conn:
                yield conn
            return
        async with self._sqlite_writer, self.engine.connect() as conn:
            driver = conn.sync_connection.connection.driver_connection
            driver.begin_alone()
            try:
                yield conn
            finally:
                driver.end_alone()

    def alone_writer(self) -> Callable[[], contextlib.AbstractAsyncContextManager[AsyncConnection | direct.Alone]]:
        """:meth:`alone` for one serial writer (the Signal Worker, a Batcher writing alone), which
        never writes twice at once: on PostgreSQL on a connection of its own (:class:`.direct.Own`)."""
        if self._sqlite_writer is None:
            assert self._direct is not None
            return self._direct.own(self.engine.sync_engine)
        return self.alone

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reading only.

        On SQLite it is a deferred transaction (one snapshot, no write lock). On
        PostgreSQL it runs without BEGIN/COMMIT: each statement sees its own snapshot,
        exactly as inside a READ COMMITTED transaction, for two round trips less.
        """
        async with self._reader.connect() as conn:
            if self.dialect == "postgresql":
                yield conn
                return
            async with conn.begin():
                yield conn

    async def vacuum(self, table: str) -> None:
        """VACUUM ``table`` on PostgreSQL, its indexes too however few of its pages changed
        (see :mod:`.vacuum`); skipped when another VACUUM holds it."""
        async with self._reader.connect() as conn:  # AUTOCOMMIT: VACUUM runs outside a transaction
            await conn.exec_driver_sql(f"VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) {table}")

    async def fetch(self, query: direct.Query, **params: Any) -> Sequence[Sequence[Any]]:
        """The rows of one read-only statement, run straight on the driver (see :mod:`.direct`)."""
        if self._direct is not None:
            return await self._direct.rows(query, params)
        # An in-memory database lives in the engine's one connection.
        sql, values = query.bind(self.engine.dialect, params)
        async with self.read() as conn:
            return (await conn.exec_driver_sql(sql, values)).all()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            # A pooled connection's info outlives its transactions: drop what a rolled-back one left.
            for key in (_ON_COMMIT, _CHANNELS, _CARRIED):
                conn.info.pop(key, None)
            conn.info[_STORE] = self
            async with conn.begin():
                yield conn
                if self.dialect == "postgresql":
                    await self._notify_postgres(conn)
            conn.info.pop(_STORE, None)
            conn.info.pop(_CHANNELS, None)
            conn.info.pop(_CARRIED, None)
            for callback in conn.info.pop(_ON_COMMIT, ()):
                callback()

    async def _notify_postgres(self, conn: AsyncConnection) -> None:
        """The transaction's last statement: its NOTIFY, and the rows it carries (:func:`carry`)."""
        channels = [notifications.pg_payload(self.origin, c) for c in sorted(conn.info.pop(_CHANNELS, ()))]
        carried: dict[Carried, list[Any]] = conn.info.pop(_CARRIED, {})
        if carried:
            params: dict[str, Any] = {"channel": notifications.PG_CHANNEL, "payloads": channels}
            for each, rows in carried.items():
                params.update(each.params(rows))
            await direct.run(conn, _carrying(tuple(each.with_clause for each in carried)), **params)
        elif channels:
            await conn.execute(_PG_NOTIFY, {"channel": notifications.PG_CHANNEL, "payloads": channels})

    async def close(self) -> None:
        if self._direct is not None:
            await self._direct.close()
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._checkpointer is not None:
            await self._checkpointer.close()
        await self.engine.dispose()


