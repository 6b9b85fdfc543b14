"""Queries of the NIP-98 scheme: the User of a key, and the ids of accepted events, for the replay window."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import jsontext
from agent_gateway.store import direct
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.users import User
from agent_gateway.store.tables import channel_identities, nostr_auth_events, users

# The User of a key: one statement straight on the driver, as a Token's User is.
_USER_OF = direct.Query(
    sa.select(users.c.id, users.c.attributes, users.c.created_at)
    .select_from(channel_identities.join(users, users.c.id == channel_identities.c.user_id))
    .where(channel_identities.c.identity == sa.bindparam("identity"))
)

# Expired ids, skipping those another process is removing (removers at once would otherwise
# queue behind each other's row locks on the same expired rows, or deadlock).
_EXPIRED = sa.select(nostr_auth_events.c.created_at, nostr_auth_events.c.event_id).where(
    nostr_auth_events.c.created_at < sa.bindparam("before"))
_PURGE = {
    "postgresql": direct.Query(nostr_auth_events.delete().where(
        sa.tuple_(nostr_auth_events.c.created_at, nostr_auth_events.c.event_id).in_(_EXPIRED.with_for_update(skip_locked=True)))),
    "sqlite": direct.Query(nostr_auth_events.delete().where(nostr_auth_events.c.created_at < sa.bindparam("before"))),
}
# New ids, each remembered unless it is already: the ids returned are those written.
_REMEMBER_POSTGRES = direct.Query(sa.text(
    "INSERT INTO nostr_auth_events (created_at, event_id) "
    "SELECT * FROM unnest(CAST(:created_at AS bigint[]), CAST(:event_ids AS text[])) "
    "ON CONFLICT (created_at, event_id) DO NOTHING RETURNING event_id"
))


@functools.lru_cache(maxsize=64)
def _remember_sqlite(count: int) -> str:
    values = ", ".join(["(?, ?)"] * count)
    return f"INSERT INTO nostr_auth_events (created_at, event_id) VALUES {values} ON CONFLICT (created_at, event_id) DO NOTHING RETURNING event_id"


async def user_of(store: Store, identity: str) -> User | None:
    """The User ``identity`` is linked to, if any."""
    rows = await store.fetch(_USER_OF, identity=identity)
    if not rows:
        return None
    user_id, attributes, created_at = rows[0]
    return User(user_id, jsontext.loads(attributes), created_at)


async def purge(conn: AsyncConnection, *, before: int) -> None:
    """Forget the ids of events created before ``before`` (Unix seconds)."""
    await direct.run(conn, _PURGE[conn.dialect.name], before=before)


async def remember(conn: AsyncConnection, accepted: Sequence[tuple[str, int]]) -> list[bool]:
    """For each ``(event id, its event's created_at)``, in order: True when the id was new, and
    is remembered until a :func:`purge` past its created_at; False when it is remembered already
    (or came earlier in ``accepted``). One statement, decided by the primary key, so two
    processes cannot both take one id, in a transaction or alone (:meth:`Store.alone`)."""
    new = dict(accepted)
    ids, created = list(new), list(new.values())
    if conn.dialect.name == "postgresql":
        rows = await direct.run(conn, _REMEMBER_POSTGRES, created_at=created, event_ids=ids)
    else:
        rows = await direct.run_sqlite(conn, _remember_sqlite(len(ids)), [v for pair in zip(created, ids, strict=True) for v in pair])
    written = {row[0] for row in rows}
    results = []
    for event_id, _ in accepted:
        results.append(event_id in written)
        written.discard(event_id)  # a second request with the same event, in the same batch, is a replay
    return results
