"""Users: the operator-side programmatic API (spec: Authentication 9).

There is no HTTP route that writes a User: admitting one and setting its
Attributes happen only here (and in the CLI built on it). Every function
takes a connection inside the caller's transaction. Nothing removes a User.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.store.queries import users as queries
from agent_gateway.store.queries.users import User

__all__ = ["User", "UserNotFound", "admit", "get", "list_newest", "set_attributes"]


class UserNotFound(errors.NotFound):
    """No User has that id."""


async def admit(conn: AsyncConnection) -> User:
    """Admit a new User: a fresh id, Attributes ``{}``, created now. Emits no Signal."""
    # Random throughout (version 4), not ids.new's time-ordered: a User's id is their only handle.
    return await queries.insert(conn, id=str(uuid.uuid4()), attributes={}, created_at=clock.now_iso())


async def get(conn: AsyncConnection, user_id: str) -> User:
    """The User with ``user_id``; raises :class:`UserNotFound`."""
    user = await queries.get(conn, id=user_id)
    if user is None:
        raise UserNotFound()
    return user


async def list_newest(conn: AsyncConnection, limit: int) -> list[User]:
    """Up to ``limit`` Users, newest first."""
    return await queries.newest(conn, limit=limit)


async def set_attributes(conn: AsyncConnection, user_id: str, attributes: Any) -> User:
    """Replace a User's Attributes wholesale with any JSON value; raises :class:`UserNotFound`."""
    user = await queries.set_attributes(conn, id=user_id, attributes=attributes)
    if user is None:
        raise UserNotFound()
    return user
