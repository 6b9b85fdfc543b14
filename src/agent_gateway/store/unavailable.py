"""Errors that mean the database cannot be reached right now, not that a request was wrong."""

from __future__ import annotations

import asyncio
import sqlite3

import asyncpg
from sqlalchemy import exc as sa_exc

# Errors that mean the database cannot be reached right now: a restart, a dropped
# connection, SQLite's lock held past the busy timeout. Not bugs: the client may retry.
# The asyncpg classes: a lost connection (08xxx); a server shutting down, crashed or
# starting up (57P01-57P03); and the client's protocol state broken by a server that
# ended the session mid-statement (MagicStack/asyncpg#1069). Reads straight on the
# driver (store.direct) and SQLite's BEGIN raise them unwrapped; SQLite's own
# OperationalError stands for the lock held past the busy timeout, as SQLAlchemy's does.
UNAVAILABLE = (
    ConnectionError,
    sqlite3.OperationalError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
)


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` is one of these, raised by the driver or wrapped by SQLAlchemy."""
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return True
        # SQLAlchemy's asyncpg adapter wraps a driver error it does not classify (a refused
        # connect while the server shuts down, say) in a plain DBAPIError; the driver's is its cause.
        return exc.orig is not None and database_unavailable(exc.orig.__cause__)
    return isinstance(exc, UNAVAILABLE)


# What a connection of its own (the leader's lock session, the notification listener) raises
# when the database or its session goes away. A session the server ended between two
# statements (its FATAL read, its socket not yet closed: under load the backend takes a while
# to exit) makes asyncpg's next statement raise InternalClientError ("another operation is in
# progress", MagicStack/asyncpg#1069); uncaught, it ended the loop that held the connection.
CONNECTION_LOST = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)
