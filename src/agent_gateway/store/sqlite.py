"""SQLite connections that execute on the event loop's own thread.

SQLAlchemy's asyncio adapter drives a connection through awaitable calls
(open a cursor, execute, fetch, commit ...). aiosqlite answers each one from
the connection's own thread, so a single query costs several hand-offs between
threads, each one far dearer than the query itself: the gateway's statements
are indexed lookups and single-row writes on a local file that SQLite answers
in microseconds. These connections answer the same calls at once instead.

The one thing that could hold the loop up is waiting for another process's
write lock, so connections have no busy timeout: a statement that finds the
database locked is tried again after an asyncio sleep, until its busy
timeout has passed (``database.busy_timeout_ms``; :data:`BUSY_TIMEOUT_S` by default). In WAL mode with ``synchronous=NORMAL`` a
commit does not wait for the disk; only a checkpoint does, and the Store's
connections leave those to a thread (``store.wal``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

BUSY_TIMEOUT_S = 30.0
# A locked database is tried again after 0.5 ms, then after twice as long each time, up to 5 ms.
_BUSY_FIRST_S = 0.0005
_BUSY_LONGEST_S = 0.005

T = TypeVar("T")


async def connect(
    database: str,
    *,
    pragmas: Sequence[str] = (),
    committed: Callable[[], None] | None = None,
    busy_timeout_s: float = BUSY_TIMEOUT_S,
) -> Connection:
    """Open ``database`` with no implicit transactions; ``pragmas`` run first, in order.

    ``committed`` is called after each commit of a transaction that wrote.
    """
    connection = sqlite3.connect(database, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        for pragma in pragmas:
            await _unlocked(lambda: connection.execute(f"PRAGMA {pragma}"), busy_timeout_s)
    except BaseException:
        connection.close()
        raise
    return Connection(connection, committed, busy_timeout_s)


async def _unlocked(call: Callable[[], T], busy_timeout_s: float) -> T:
    """``call()``, tried again while it finds the database locked by another connection."""
    delay = _BUSY_FIRST_S
    deadline: float | None = None
    while True:
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            now = asyncio.get_running_loop().time()
            deadline = deadline or now + busy_timeout_s
            if now >= deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, _BUSY_LONGEST_S)


class Connection:
    """What SQLAlchemy's aiosqlite adapter expects of a connection."""

    def __init__(
        self, connection: sqlite3.Connection, committed: Callable[[], None] | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S
    ) -> None:
        self._connection = connection
        self._committed = committed
        self._busy_timeout_s = busy_timeout_s
        self._changes = 0

    @property
    def isolation_level(self) -> str | None:
        return self._connection.isolation_level

    def cursor(self) -> Cursor:
        return Cursor(self._connection.cursor(), self._busy_timeout_s)

    async def begin(self, *, immediate: bool) -> None:
        """Open a transaction; an ``immediate`` one takes the write lock now."""
        await _unlocked(lambda: self._connection.execute("BEGIN IMMEDIATE" if immediate else "BEGIN"), self._busy_timeout_s)
        self._changes = self._connection.total_changes

    async def commit(self) -> None:
        await _unlocked(self._connection.commit, self._busy_timeout_s)
        self._wrote()

    def begin_alone(self) -> None:
        """Statements follow with no transaction, each committing on its own; :meth:`end_alone` after them."""
        self._changes = self._connection.total_changes

    def end_alone(self) -> None:
        """Those statements are done: as after a commit."""
        self._wrote()

    def _wrote(self) -> None:
        if self._committed is not None and self._connection.total_changes != self._changes:
            self._committed()

    async def rollback(self) -> None:
        self._connection.rollback()

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        self._connection.create_function(*args, **kwargs)

    async def close(self) -> None:
        self._connection.close()

    def stop(self) -> None:
        self._connection.close()


class Cursor:
    """What SQLAlchemy's aiosqlite adapter expects of a cursor."""

    def __init__(self, cursor: sqlite3.Cursor, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self._cursor = cursor
        self._busy_timeout_s = busy_timeout_s

    async def __aenter__(self) -> Cursor:
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        self._cursor.close()

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value

    async def execute(self, sql: str, parameters: Any = ()) -> Cursor:
        await _unlocked(lambda: self._cursor.execute(sql, parameters), self._busy_timeout_s)
        return self

    async def executemany(self, sql: str, parameters: Any) -> Cursor:
        await _unlocked(lambda: self._cursor.executemany(sql, parameters), self._busy_timeout_s)
        return self

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(self._cursor.arraysize if size is None else size)

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def close(self) -> None:
        self._cursor.close()
