"""Queries on Tokens: one row per Token, keyed by the SHA-256 digest of its text."""

from __future__ import annotations

import asyncio

import aiosqlite
import asyncpg
import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import engine
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import tokens, users
from agent_gateway.store.users import User


async def insert(conn: AsyncConnection, *, digest: str, user_id: str, created_at: str, expires_at: str) -> None:
    await conn.execute(
        tokens.insert().values(digest=digest, user_id=user_id, created_at=created_at, expires_at=expires_at)
    )


# Lookups in flight at once on PostgreSQL; more wait their turn for a moment.
POSTGRES_CONNECTIONS = 4

# The whole authenticated path of a request: one primary-key lookup joined to its User.
_USER_BY_DIGEST = (
    sa.select(users.c.id, users.c.attributes, users.c.created_at)
    .select_from(tokens.join(users, users.c.id == tokens.c.user_id))
    .where(tokens.c.digest == sa.bindparam("digest"), tokens.c.expires_at > sa.bindparam("now"))
)


class UserByToken:
    """The authenticated path's one query, on database connections of its own.

    It runs on every protected request, so it is one statement straight on
    the driver, outside any transaction (each statement sees what is
    committed, so a revoked Token is refused at once). Through SQLAlchemy's
    async adapters and a Store transaction (BEGIN, SELECT, COMMIT), with the
    pooled connections' threads contending, the same lookup costs the
    process several times the CPU of the whole rest of the request. SQLite
    gets one reading connection (WAL readers never wait for the writer);
    PostgreSQL a small asyncpg pool. Both open on first use, in the process
    and event loop that use them, and close with :meth:`close`.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        compiled = _USER_BY_DIGEST.compile(dialect=store.engine.dialect)
        self._sql = str(compiled)
        self._names = tuple(compiled.positiontup or ())
        self._opening = asyncio.Lock()
        self._sqlite: aiosqlite.Connection | None = None
        self._pool: asyncpg.Pool | None = None

    async def user(self, *, digest: str, now: str) -> User | None:
        """The User holding the Token with ``digest`` if that Token has not expired at ``now``."""
        values = {"digest": digest, "now": now}
        params = tuple(values[name] for name in self._names)
        if self._store.dialect == "postgresql":
            row = await (await self._postgres()).fetchrow(self._sql, *params)
        else:
            rows = await (await self._sqlite_connection()).execute_fetchall(self._sql, params)
            row = rows[0] if rows else None
        return None if row is None else User(row[0], orjson.loads(row[1]), row[2])

    async def _postgres(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    engine.libpq_dsn(self._store.url), min_size=1, max_size=POSTGRES_CONNECTIONS
                )
        return self._pool

    async def _sqlite_connection(self) -> aiosqlite.Connection:
        if self._sqlite is not None:
            return self._sqlite
        async with self._opening:
            if self._sqlite is None:
                connection = await aiosqlite.connect(self._store.engine.url.database)
                await connection.execute(f"PRAGMA busy_timeout={engine.SQLITE_BUSY_TIMEOUT_MS}")
                await connection.execute("PRAGMA query_only=ON")
                self._sqlite = connection
        return self._sqlite

    async def close(self) -> None:
        async with self._opening:
            if self._sqlite is not None:
                await self._sqlite.close()
                self._sqlite = None
            if self._pool is not None:
                await self._pool.close()
                self._pool = None


async def delete_one(conn: AsyncConnection, *, digest: str, user_id: str) -> None:
    await conn.execute(tokens.delete().where(tokens.c.digest == digest, tokens.c.user_id == user_id))


async def delete_for_user(conn: AsyncConnection, *, user_id: str) -> None:
    await conn.execute(tokens.delete().where(tokens.c.user_id == user_id))
