"""What the Message-log tests share: a tiny authentication scheme and reads of stored rows.

``UserIdScheme`` accepts ``Authorization: Bearer test-<user id>`` for an admitted
User, so the Public routes can be tested without the password scheme.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi import Request

from agent_gateway.auth import schemes
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import users as user_queries
from agent_gateway.store.tables import messages, signals


# A Message record's fields, in the order responses give them.
FIELDS = ["id", "userId", "direction", "seq", "text", "createdAt"]


def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"statusCode", "error", "message"}
    assert body["statusCode"] == status


class UserIdScheme:
    """Accepts `Bearer test-<user id>` for an admitted User."""

    async def authenticate(self, request: Request) -> schemes.Authenticated | None:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer test-"):
            return None
        async with request.app.state.store.read() as conn:
            user = await user_queries.get(conn, id=header.removeprefix("Bearer test-"))
        return None if user is None else schemes.Authenticated(user, self)


def bearer(user_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer test-{user_id}"}


async def stored_messages(store: Store) -> list[dict[str, Any]]:
    """Every stored Message row, by User then seq."""
    async with store.read() as conn:
        rows = await conn.execute(sa.select(messages).order_by(messages.c.user_id, messages.c.seq))
        return [dict(row._mapping) for row in rows]


async def stored_signals(store: Store) -> list[dict[str, Any]]:
    """Every stored Signal row, in emission order."""
    async with store.read() as conn:
        rows = await conn.execute(sa.select(signals).order_by(signals.c.position))
        return [dict(row._mapping) for row in rows]


async def waiting_on_a_lock(store: Store) -> None:
    """Return once some other PostgreSQL backend of this database waits on a lock."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while True:
        async with store.read() as conn:
            if (await conn.execute(query)).scalar_one():
                return
        await asyncio.sleep(0.01)
