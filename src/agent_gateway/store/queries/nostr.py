"""Queries of the NIP-98 scheme: the ids of accepted events, for the replay window."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.tables import nostr_auth_events


async def first_use(conn: AsyncConnection, *, event_id: str, now: int, expires_at: int) -> bool:
    """Remember ``event_id`` until ``expires_at``; False when it is remembered already.

    Decided by the primary key, so two processes accepting one event at once cannot both win.
    """
    await conn.execute(nostr_auth_events.delete().where(nostr_auth_events.c.expires_at < now))
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(nostr_auth_events)
    written = await conn.execute(
        insert.values(event_id=event_id, expires_at=expires_at)
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(nostr_auth_events.c.event_id)
    )
    return written.first() is not None
