"""Queries on Users' password digests (the ``users.password_digest`` column)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.queries.users import User
from agent_gateway.store.tables import users


async def user_and_digest(conn: AsyncConnection, *, id: str) -> tuple[User, str | None] | None:
    """The User with ``id`` and its password digest (None when it has no password), or None."""
    query = sa.select(users.c.id, users.c.attributes, users.c.created_at, users.c.password_digest).where(
        users.c.id == id
    )
    row = (await conn.execute(query)).first()
    return (User.from_row(row), row.password_digest) if row else None


async def set_digest(conn: AsyncConnection, *, id: str, digest: str) -> None:
    """Store a User's password digest, whatever it was."""
    await conn.execute(users.update().where(users.c.id == id).values(password_digest=digest))


async def replace_digest(conn: AsyncConnection, *, id: str, digest: str, previous: str) -> bool:
    """Store a User's new digest only if ``previous`` is still the stored one; False otherwise."""
    query = (
        users.update().where(users.c.id == id, users.c.password_digest == previous).values(password_digest=digest)
    )
    return (await conn.execute(query)).rowcount == 1
