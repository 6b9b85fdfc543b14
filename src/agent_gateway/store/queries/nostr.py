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
_EXPIRED = sa.select(nostr_auth_events.c.event_id).where(nostr_auth_events.c.expires_at < sa.bindparam("now"))
_PURGE = {
    "postgresql": direct.Query(nostr_auth_events.delete().where(
        nostr_auth_events.c.event_id.in_(_EXPIRED.with_for_update(skip_locked=True)))),
    "sqlite": direct.Query(nostr_auth_events.delete().where(nostr_auth_events.c.expires_at < sa.bindparam("now"))),
}
# New ids, each remembered unless it is already: the ids returned are those written.
_REMEMBER_POSTGRES = direct.Query(sa.text(
    "INSERT INTO nostr_auth_events (event_id, expires_at) "
    "SELECT * FROM unnest(CAST(:event_ids AS text[]), CAST(:expires_at AS bigint[])) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
))


@functools.lru_cache(maxsize=64)
def _remember_sqlite(count: int) -> str:
    values = ", ".join(["(?, ?)"] * count)
    return f"INSERT INTO nostr_auth_events (event_id, expires_at) VALUES {values} ON CONFLICT (event_id) DO NOTHING RETURNING event_id"


async def user_of(store: Store, identity: str) -> User | None:
    """The User ``identity`` is linked to, if any."""
    rows = await store.fetch(_USER_OF, identity=identity)
    if not rows:
        return None
    user_id, attributes, created_at = rows[0]
    return User(user_id, jsontext.loads(attributes), created_at)


async def purge(conn: AsyncConnection, *, now: int) -> None:
    """Forget the ids whose expiry is before ``now``."""
    await direct.run(conn, _PURGE[conn.dialect.name], now=now)


async def remember(conn: AsyncConnection, accepted: Sequence[tuple[str, int]]) -> list[bool]:
    """For each ``(event id, expires at)``, in order: True when the id was new, and is
    remembered until its expiry; False when it is remembered already (or came earlier in
    ``accepted``). One statement, decided by the primary key, so two processes cannot both
    take one id, in a transaction or alone (:meth:`Store.alone`)."""
    new = dict(accepted)
    ids, expiries = list(new), list(new.values())
    if conn.dialect.name == "postgresql":
        rows = await direct.run(conn, _REMEMBER_POSTGRES, event_ids=ids, expires_at=expiries)
    else:
        rows = await direct.run_sqlite(conn, _remember_sqlite(len(ids)), [v for pair in zip(ids, expiries, strict=True) for v in pair])
    written = {row[0] for row in rows}
    results = []
    for event_id, _ in accepted:
        results.append(event_id in written)
        written.discard(event_id)  # a second request with the same event, in the same batch, is a replay
    return results
