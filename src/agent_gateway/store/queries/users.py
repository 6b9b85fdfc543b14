"""Queries on Users."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import records
from agent_gateway.store.tables import users


@dataclasses.dataclass(frozen=True)
class User:
    id: str
    attributes: Any
    created_at: str

    def to_json(self) -> records.User:
        return {"id": self.id, "attributes": self.attributes, "createdAt": self.created_at}

    @classmethod
    def from_row(cls, row: sa.Row) -> User:
        return cls(row.id, row.attributes, row.created_at)


_COLUMNS = (users.c.id, users.c.attributes, users.c.created_at)


async def insert(conn: AsyncConnection, *, id: str, attributes: Any, created_at: str) -> User:
    await conn.execute(users.insert().values(id=id, attributes=attributes, created_at=created_at))
    return User(id, attributes, created_at)


async def get(conn: AsyncConnection, *, id: str, for_update: bool = False) -> User | None:
    query = sa.select(*_COLUMNS).where(users.c.id == id)
    if for_update and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    return User.from_row(row) if row else None


async def newest(conn: AsyncConnection, *, limit: int) -> list[User]:
    query = sa.select(*_COLUMNS).order_by(users.c.created_at.desc(), users.c.id.desc()).limit(limit)
    return [User.from_row(row) for row in await conn.execute(query)]


async def set_attributes(conn: AsyncConnection, *, id: str, attributes: Any) -> User | None:
    query = (
        users.update().where(users.c.id == id).values(attributes=attributes).returning(*_COLUMNS)
    )
    row = (await conn.execute(query)).first()
    return User.from_row(row) if row else None
