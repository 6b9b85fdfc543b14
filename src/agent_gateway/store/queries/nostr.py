"""Queries of the NIP-98 scheme: the ids of accepted events, for the replay window."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.tables import nostr_auth_events

# Expired ids removed by one request at most: more than arrive in one, so the table stays small.
PURGE_BATCH = 16


async def first_use(conn: AsyncConnection, *, event_id: str, now: int, expires_at: int) -> bool:
    """Remember ``event_id`` until ``expires_at``; False when it is remembered already.

    Decided by the primary key, so two processes accepting one event at once cannot both win.
    """
    # Expired ids go a batch at a time, skipping those another request is removing: requests
    # at once would otherwise queue behind each other's row locks on the same expired rows.
    expired = sa.select(nostr_auth_events.c.event_id).where(nostr_auth_events.c.expires_at < now).limit(PURGE_BATCH)
    if conn.dialect.name == "postgresql":
        expired = expired.with_for_update(skip_locked=True)
    await conn.execute(nostr_auth_events.delete().where(nostr_auth_events.c.event_id.in_(expired)))
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(nostr_auth_events)
    written = await conn.execute(
        insert.values(event_id=event_id, expires_at=expires_at)
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(nostr_auth_events.c.event_id)
    )
    return written.first() is not None
