"""Statements straight on the database driver: single-statement reads, and hot writes on SQLite.

The hottest reads (the User behind a Token, a window of a log, one Decision)
are one statement each, which needs no transaction: the statement sees one
snapshot of what is committed. SQLAlchemy's execution layer (pool checkout,
events, BEGIN and COMMIT, the result machinery) costs several times what such
a statement costs the database, so these run on connections of their own:
SQLAlchemy compiles each statement once per dialect, and the driver runs it.
Rows come back as the driver gives them (tuples, or asyncpg Records), with
no type processing: callers decode JSON columns themselves.

:func:`run` does the same for a statement inside the caller's transaction. On
SQLite the BEGIN was sent on the very driver connection (see ``store.engine``);
on PostgreSQL SQLAlchemy's asyncpg adapter begins its transaction with the first
statement, so :func:`run` asks it to when this statement is the first, under the
adapter's own lock, and then runs the statement on the adapter's asyncpg
connection: the same transaction, a third of the client's time per statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import sqlite

logger = logging.getLogger(__name__)

# Reads in flight at once per process on PostgreSQL; more wait their turn for a moment.
POSTGRES_CONNECTIONS = 4
# SQLite's reads map the database file (up to this much of it) instead of copying each page
# out of the OS's cache with a read() call: a proof on a long log reads pages spread over the
# whole file, and those calls were the tail of its latency. Address space only; what is
# resident is the OS's page cache, shared with every process.
SQLITE_MMAP_BYTES = 1 << 30
# Every read here is one index lookup or range whose plan does not depend on the values.
# A custom plan per execution (PostgreSQL's default for the first runs of a prepared
# statement, and whenever it estimates one cheaper) probes the index for the column's
# actual bounds while planning, which costs more as the table grows: on a log of
# 1,000,000 Decisions, a page read took 1.5x its time on 1,000; with the generic plan, the same.
_GENERIC_PLANS = {"plan_cache_mode": "force_generic_plan"}


class Query:
    """A statement with named bind parameters, compiled once per dialect."""

    def __init__(self, statement: sa.Executable) -> None:
        self.statement = statement
        self._compiled: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {}

    def bind(self, dialect: sa.Dialect, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL text for ``dialect`` and its positional parameters from ``params``.

        Parameters the statement holds values for itself (SQLite's ``OFFSET 0``)
        need not be given.
        """
        sql, names, own = self._compile(dialect)
        return sql, tuple(params[name] if name in params else own[name] for name in names)

    def bind_many(self, dialect: sa.Dialect, params: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[Any, ...]]]:
        """:meth:`bind` for each of ``params`` (all giving the same names), the names looked up once."""
        sql, names, own = self._compile(dialect)
        if own.keys() - params[0].keys():
            return sql, [self.bind(dialect, one)[1] for one in params]
        pick = operator.itemgetter(*names)
        if len(names) == 1:
            return sql, [(pick(one),) for one in params]
        return sql, [pick(one) for one in params]

    def _compile(self, dialect: sa.Dialect) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        try:
            return self._compiled[dialect.name]
        except KeyError:
            compiled = self.statement.compile(dialect=dialect)
            self._compiled[dialect.name] = (str(compiled), tuple(compiled.positiontup or ()), dict(compiled.params))
            return self._compiled[dialect.name]


async def run(conn: AsyncConnection | Alone, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
    """The rows (if any) of ``query`` run in the transaction of ``conn`` (or alone, :class:`Alone`).

    Parameters are plain values on both backends: a statement meant for this
    declares a JSON column's parameter as text, and the caller passes JSON text.
    """
    sql, values = query.bind(conn.dialect, params)
    if isinstance(conn, Alone):
        return await conn.driver.fetch(sql, *values)
    if conn.dialect.name == "postgresql":
        async with _in_transaction(conn) as driver:
            return await driver.fetch(sql, *values)
    return await run_sqlite(conn, sql, values)


async def run_many(conn: AsyncConnection, query: Query, params: Sequence[Mapping[str, Any]]) -> None:
    """``query`` run once for each of ``params``, in order, in the transaction of ``conn`` (no rows)."""
    sql, values = query.bind_many(conn.dialect, params)
    if conn.dialect.name == "postgresql":
        async with _in_transaction(conn) as driver:
            await driver.executemany(sql, values)
        return
    cursor = conn.sync_connection.connection.driver_connection.cursor()
    async with cursor:
        await cursor.executemany(sql, values)


async def run_sqlite(conn: AsyncConnection, sql: str, values: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """The rows (if any) of ``sql`` with its positional ``values`` in the SQLite transaction of
    ``conn``; for a statement whose text follows the data (a multi-row VALUES list), which a
    :class:`Query` cannot be."""
    cursor = conn.sync_connection.connection.driver_connection.cursor()
    async with cursor:
        return await (await cursor.execute(sql, values)).fetchall()


@contextlib.asynccontextmanager
async def _in_transaction(conn: AsyncConnection) -> AsyncIterator[asyncpg.Connection]:
    """The asyncpg connection under ``conn``, its transaction begun as SQLAlchemy's adapter begins it.

    The adapter (``sqlalchemy.dialects.postgresql.asyncpg``) sends BEGIN before the
    first statement of a transaction and COMMIT or ROLLBACK when SQLAlchemy ends
    it; holding its lock keeps a statement of its own from interleaving.
    """
    adapter = conn.sync_connection.connection.dbapi_connection
    async with adapter._execute_mutex:
        if adapter._transaction is None:
            try:
                await adapter._start_transaction()
            except Exception as exc:  # translated by the adapter: raise the driver's, as a statement here would
                raise (exc.__cause__ or exc) from None
        yield adapter._connection


async def _nothing_to_reset(connection: asyncpg.Connection) -> None:
    """A read here changes no session state, so a connection returns to the pool as it is.

    asyncpg's default resets every connection handed back (``RESET ALL``,
    ``UNLISTEN *`` ...), one more round trip per read.
    """


class Alone:
    """A PostgreSQL connection of the :class:`Reader`'s whose statements each commit on their own
    (``Store.alone``): :func:`run` takes it where it takes a transaction's connection. Its generic
    plans suit what runs alone: each statement writes rows found by their keys (a Message, an outbox
    row, a Signal Worker's step), whose plan does not depend on the values; a custom plan per
    execution cost an inbound Message's statement 0.55 ms of the server's time at each bind, the
    generic one 0.05 ms (the statement log, ``log_min_duration_statement = 0``)."""

    def __init__(self, dialect: sa.Dialect, driver: asyncpg.Connection, sync_engine: sa.Engine, *, own: bool = False) -> None:
        self.dialect = dialect
        self.driver = driver
        # A connection of one writer's own (:class:`Own`), kept between its uses: what it holds
        # for its session (a lock) is still its own at the next use.
        self.own = own
        # The engine whose writes these are (what a transaction's connection names so).
        self.sync_engine = sync_engine
        # Outside a Store's transaction: what store.engine reads here (its Store) is absent.
        self.info: dict[str, Any] = {}


class Reader:
    """Connections for :class:`Query` reads, opened on first use in the loop that uses them."""

    def __init__(self, dialect: sa.Dialect, *, sqlite_database: str | None, postgres_dsn: str | None) -> None:
        self._dialect = dialect
        self._sqlite_database = sqlite_database
        self._postgres_dsn = postgres_dsn
        self._opening = asyncio.Lock()
        # On SQLite one connection is enough: statements run on the loop, one at a time.
        self._sqlite: sqlite.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        # Reads take their turn at the pool here, first come first served. asyncpg's pool hands
        # a connection back through an asyncio.Queue, whose woken waiter loses the connection
        # to any read that arrives before it runs, and then waits again at the back: under
        # 16 concurrent reads on 4 connections some waited 100 ms and more (a p99 of 110 ms
        # on GET /decisions?limit=50 against a mean of 10 ms; 13-20 ms with this).
        self._turns = asyncio.Semaphore(POSTGRES_CONNECTIONS)
        self._owned: list[Own] = []

    async def rows(self, query: Query, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        sql, values = query.bind(self._dialect, params)
        if self._postgres_dsn is not None:
            pool = await self._postgres()
            async with self._turns:
                return await pool.fetch(sql, *values)
        cursor = (await self._sqlite_connection()).cursor()
        async with cursor:
            return await (await cursor.execute(sql, values)).fetchall()

    @contextlib.asynccontextmanager
    async def alone(self, sync_engine: sa.Engine) -> AsyncIterator[Alone]:
        """A connection for statements of ``sync_engine``'s that each commit alone (PostgreSQL),
        taking its turn as a read does."""
        pool = await self._postgres()
        async with self._turns, pool.acquire() as connection:
            yield Alone(self._dialect, connection, sync_engine)

    def own(self, sync_engine: sa.Engine) -> Own:
        """A connection of one serial writer's own for statements of ``sync_engine``'s that each
        commit alone (PostgreSQL), opened beside its first use; closed with this Reader."""
        own = Own(self, sync_engine)
        self._owned.append(own)
        return own

    async def _postgres(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self._postgres_dsn,
                    min_size=1,
                    max_size=POSTGRES_CONNECTIONS,
                    server_settings=_GENERIC_PLANS,
                    reset=_nothing_to_reset,
                )
        return self._pool

    async def _sqlite_connection(self) -> sqlite.Connection:
        if self._sqlite is not None:
            return self._sqlite
        async with self._opening:
            if self._sqlite is None:
                assert self._sqlite_database is not None
                self._sqlite = await sqlite.connect(self._sqlite_database, pragmas=("query_only=ON", f"mmap_size={SQLITE_MMAP_BYTES}"))
        return self._sqlite

    async def close(self) -> None:
        async with self._opening:
            if self._sqlite is not None:
                await self._sqlite.close()
                self._sqlite = None
            if self._pool is not None:
                await self._pool.close()
                self._pool = None
            for own in self._owned:
                await own.close()


class Own:
    """A PostgreSQL connection of one serial writer's own (the Signal Worker, a Batcher writing
    alone), for its statements that each commit alone: :meth:`__call__` gives it as
    :meth:`Reader.alone` gives one of the pool's. A statement on a connection checked out of
    asyncpg's pool and back took about 35 µs more of the client's CPU and latency than on a
    connection held (the return is shielded: a turn of the loop), and a Message's answer waits for
    two such statements in series. Never used by two at once: its writer writes one step or batch
    at a time.

    Opened beside the first use, which takes one of the pool's meanwhile, as does any use while
    it is lost and opened again: no write waits for a connection to open."""

    def __init__(self, reader: Reader, sync_engine: sa.Engine) -> None:
        self._reader = reader
        self._sync_engine = sync_engine
        self._connection: asyncpg.Connection | None = None
        self._opening: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[Alone]:
        connection = self._connection
        if connection is None or connection.is_closed():
            self._connection = None
            if self._opening is None or self._opening.done():
                self._opening = asyncio.create_task(self._open(), name="own connection")
            async with self._reader.alone(self._sync_engine) as pooled:
                yield pooled
            return
        try:
            yield Alone(self._reader._dialect, connection, self._sync_engine, own=True)
        except asyncpg.PostgresError:  # refused by the server: the connection is as good as before
            raise
        except BaseException:
            # Cancelled mid-statement, or the connection failed: the next use opens a fresh one.
            self._connection = None
            connection.terminate()
            raise

    async def opened(self) -> None:
        """Wait until a connection being opened is (or failed to be)."""
        if self._opening is not None:
            await asyncio.wait({self._opening})

    async def _open(self) -> None:
        try:
            self._connection = await asyncpg.connect(self._reader._postgres_dsn, server_settings=_GENERIC_PLANS)
        except Exception as exc:  # the uses go on on the pool's, and the next one tries again
            logger.warning("cannot open a writer's own connection: %s", type(exc).__name__, extra={"action": "connect_error"})

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.wait({self._opening})
            self._opening = None
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed():
            await connection.close()
