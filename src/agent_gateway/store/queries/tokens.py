"""Queries on Tokens: one row per Token, keyed by the SHA-256 digest of its text."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import jsontext
from agent_gateway.store import direct
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.users import User
from agent_gateway.store.tables import tokens, users


async def insert(conn: AsyncConnection, *, digest: str, user_id: str, created_at: str, expires_at: str) -> None:
    await conn.execute(
        tokens.insert().values(digest=digest, user_id=user_id, created_at=created_at, expires_at=expires_at)
    )


# The whole authenticated path of a request: one primary-key lookup joined to its User.
# It runs on every protected request, so it reads straight on the driver (see
# store.direct), outside any transaction: a revoked Token is refused at once.
_USER_BY_DIGEST = direct.Query(
    sa.select(users.c.id, users.c.attributes, users.c.created_at)
    .select_from(tokens.join(users, users.c.id == tokens.c.user_id))
    .where(tokens.c.digest == sa.bindparam("digest"), tokens.c.expires_at > sa.bindparam("now"))
)


async def user_by_digest(store: Store, *, digest: str, now: str) -> User | None:
    """The User holding the Token with ``digest`` if that Token has not expired at ``now``."""
    rows = await store.fetch(_USER_BY_DIGEST, digest=digest, now=now)
    return _user(*rows[0]) if rows else None


# The lookups of many requests at once as one statement (PostgreSQL, where each is a round trip):
# each digest with the instant its request was checked at, numbered by its place.
_USERS_BY_DIGESTS = direct.Query(
    sa.text(
        "SELECT d.n, u.id, u.attributes, u.created_at "
        "FROM unnest(:digests, :nows) WITH ORDINALITY AS d(digest, now, n) "
        "JOIN tokens AS t ON t.digest = d.digest AND t.expires_at > d.now "
        "JOIN users AS u ON u.id = t.user_id"
    ).bindparams(*(sa.bindparam(name, type_=postgresql.ARRAY(sa.Text)) for name in ("digests", "nows")))
)


async def users_by_digests(store: Store, lookups: Sequence[tuple[str, str]]) -> list[User | None]:
    """:func:`user_by_digest` of each ``(digest, now)``, in their places, with one statement."""
    if len(lookups) == 1:
        [(digest, now)] = lookups
        return [await user_by_digest(store, digest=digest, now=now)]
    digests, nows = zip(*lookups, strict=True)
    rows = await store.fetch(_USERS_BY_DIGESTS, digests=list(digests), nows=list(nows))
    found = {n: _user(*user) for n, *user in rows}
    return [found.get(n) for n in range(1, len(lookups) + 1)]


def _user(user_id: str, attributes: str, created_at: str) -> User:
    return User(user_id, jsontext.loads(attributes), created_at)


async def live_digests(store: Store, *, digests: list[str], now: str) -> set[str]:
    """Which of ``digests`` belong to Tokens that exist and have not expired at ``now``."""
    live: set[str] = set()
    async with store.read() as conn:
        for start in range(0, len(digests), _CHUNK):
            query = sa.select(tokens.c.digest).where(
                tokens.c.digest.in_(digests[start : start + _CHUNK]), tokens.c.expires_at > now
            )
            live.update((await conn.execute(query)).scalars())
    return live


# Digests per statement of live_digests (far below every backend's limit on parameters).
_CHUNK = 500


async def delete_one(conn: AsyncConnection, *, digest: str, user_id: str) -> None:
    await conn.execute(tokens.delete().where(tokens.c.digest == digest, tokens.c.user_id == user_id))


async def delete_for_user(conn: AsyncConnection, *, user_id: str) -> None:
    await conn.execute(tokens.delete().where(tokens.c.user_id == user_id))
