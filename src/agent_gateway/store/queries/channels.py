"""Queries of the chat channels: identities, pairing requests, conversations, read positions, the outbox.

The outbox's claims, leases and outcomes are the shared outbox's (``store.outbox``),
each channel claiming only its own rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import errors
from agent_gateway.store import direct, outbox
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import messages as message_queries
from agent_gateway.store.queries import retention
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.outbox import DEAD, DELIVERED, FAILED, OPEN, PENDING, STATES  # noqa: F401 (this area's names)
from agent_gateway.store.tables import (
    INBOUND_ONLY,
    channel_conversations as private_conversations,
    channel_deliveries as deliveries,
    channel_identities as identities,
    channel_pairings as pairings,
    channel_positions as positions,
    channel_shared_conversations as shared_conversations,
    messages,
    signals,
)

MESSAGE, NOTICE = "message", "notice"


class IdentityTaken(errors.GatewayError):
    """The identity is already linked (to this User or another)."""


# --- identities ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Identity:
    identity: str
    channel: str
    user_id: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {"identity": self.identity, "channel": self.channel, "user": self.user_id, "createdAt": self.created_at}


async def link(conn: AsyncConnection, *, identity: str, channel: str, user_id: str, created_at: str) -> Identity:
    """Link ``identity`` to ``user_id``; raises :class:`IdentityTaken` when it is linked already
    (decided by the primary key, so two linkers at once cannot both win)."""
    values = {"identity": identity, "channel": channel, "user_id": user_id, "created_at": created_at}
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(identities).values(**values)
    written = await conn.execute(insert.on_conflict_do_nothing(index_elements=["identity"]).returning(identities.c.identity))
    if written.first() is None:
        raise IdentityTaken()
    return Identity(identity, channel, user_id, created_at)


async def unlink(conn: AsyncConnection, *, identity: str, user_id: str) -> bool:
    """Remove the link of ``identity`` to ``user_id``; False when there is none. What was on its
    way to the identity is the caller's (:func:`end_deliveries`, :func:`forget_conversation`)."""
    result = await conn.execute(
        identities.delete().where(identities.c.identity == identity, identities.c.user_id == user_id)
    )
    return result.rowcount > 0


async def identity(conn: AsyncConnection, identity: str) -> Identity | None:
    row = (await conn.execute(sa.select(identities).where(identities.c.identity == identity))).first()
    return None if row is None else Identity(*row)


async def identities_of(conn: AsyncConnection, user_id: str) -> list[Identity]:
    """A User's identities, oldest link first."""
    query = (
        sa.select(identities).where(identities.c.user_id == user_id)
        .order_by(identities.c.created_at, identities.c.identity)
    )
    return [Identity(*row) for row in await conn.execute(query)]


# --- pairing requests ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pairing:
    code: str
    channel: str
    identity: str
    created_at: str
    expires_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code, "channel": self.channel, "identity": self.identity,
            "createdAt": self.created_at, "expiresAt": self.expires_at,
        }


async def pairing_of(conn: AsyncConnection, identity: str) -> Pairing | None:
    """The request of ``identity``, expired or not."""
    row = (await conn.execute(sa.select(pairings).where(pairings.c.identity == identity))).first()
    return None if row is None else Pairing(*row)


async def pairing(conn: AsyncConnection, code: str) -> Pairing | None:
    row = (await conn.execute(sa.select(pairings).where(pairings.c.code == code))).first()
    return None if row is None else Pairing(*row)


async def remove_expired(conn: AsyncConnection, *, channel: str, now: str) -> None:
    await conn.execute(pairings.delete().where(pairings.c.channel == channel, pairings.c.expires_at <= now))


async def count_pending(conn: AsyncConnection, *, channel: str, now: str) -> int:
    query = sa.select(sa.func.count()).where(pairings.c.channel == channel, pairings.c.expires_at > now)
    return int((await conn.execute(query)).scalar() or 0)


async def add_pairing(conn: AsyncConnection, request: Pairing) -> None:
    await conn.execute(pairings.insert().values(dataclasses.asdict(request)))


async def remove_pairing(conn: AsyncConnection, code: str) -> bool:
    return (await conn.execute(pairings.delete().where(pairings.c.code == code))).rowcount > 0


async def pending(conn: AsyncConnection, *, now: str) -> list[Pairing]:
    """The requests not expired at ``now``, oldest first."""
    query = sa.select(pairings).where(pairings.c.expires_at > now).order_by(pairings.c.created_at, pairings.c.code)
    return [Pairing(*row) for row in await conn.execute(query)]


# --- conversations and read positions ---------------------------------------------------------


def _upsert(conn: AsyncConnection, table: sa.Table, values: Mapping[str, Any], key: str) -> sa.Executable:
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table).values(**values)
    return insert.on_conflict_do_update(
        index_elements=[key], set_={name: value for name, value in values.items() if name != key}
    )


@dataclasses.dataclass(frozen=True)
class Conversation:
    user_id: str
    channel: str
    identity: str
    conversation: str | None  # None: a private one found shared, another to open (forget_private)
    inbound_seq: int | None
    updated_at: str


async def set_conversation(conn: AsyncConnection, conversation: Conversation, *, shared: bool = False) -> None:
    """Record ``conversation`` as its User's private one, or with ``shared`` their shared one."""
    table = shared_conversations if shared else private_conversations
    await conn.execute(_upsert(conn, table, dataclasses.asdict(conversation), "user_id"))


async def forget_conversation(conn: AsyncConnection, *, user_id: str, identity: str) -> None:
    """Forget ``user_id``'s conversations on ``identity`` (one of another identity stays)."""
    for table in (private_conversations, shared_conversations):
        await conn.execute(table.delete().where(table.c.user_id == user_id, table.c.identity == identity))


def forgetting(channel: str, conversations: Sequence[str]) -> sa.Update:
    """The statement of :func:`forget_private` that takes ``conversations`` off the Users' private ones
    (found by ``ix_channel_conversations_channel_conversation``, not a scan of the channel's Users)."""
    return private_conversations.update().where(
        private_conversations.c.channel == channel, private_conversations.c.conversation.in_(conversations)
    ).values(conversation=None)


async def forget_private(conn: AsyncConnection, *, channel: str, conversations: Sequence[str]) -> None:
    """Forget every User's private conversation on ``channel`` that is one of ``conversations``
    (the row stays, its conversation NULL: one is opened with its identity at the next delivery, and
    their most recent inbound Message still counts as come by the channel), and take those
    conversations off the open deliveries of Messages written for them while they were private:
    such a delivery opens the User's private conversation when it is sent, never going where
    others read (an answer written for the User's shared conversation stays)."""
    await conn.execute(forgetting(channel, conversations))
    answers_there = sa.select(shared_conversations.c.user_id).where(
        shared_conversations.c.channel == channel,
        shared_conversations.c.conversation == deliveries.c.conversation,
        shared_conversations.c.user_id == deliveries.c.user_id,
    )
    await conn.execute(deliveries.update().where(
        _OUTBOX.is_open, deliveries.c.channel == channel, deliveries.c.kind == MESSAGE,
        deliveries.c.conversation.in_(conversations), ~answers_there.exists(),
    ).values(conversation=None))


@dataclasses.dataclass(frozen=True)
class Route:
    """What decides where a User's outbound Messages go: their private and shared conversations
    on a channel, their most recent inbound Message's seq, the seq of their inbound Message whose
    Signal is being handled (``answering``: the Runs are serial, so at most one), and their
    identities."""

    private: Conversation | None
    shared: Conversation | None
    last_inbound_seq: int | None
    answering: int | None
    identities: tuple[str, ...]


def _answering_seq(dialect: str) -> sa.ScalarSelect[Any]:
    """The seq of the User's inbound Message whose Signal is being handled (its payload is the
    Message's record): one index probe of the Signals ``processing``."""
    if dialect == "postgresql":
        record = sa.cast(signals.c.payload, postgresql.JSONB)
        user_id, seq = record["userId"].astext, sa.cast(record["seq"].astext, sa.BigInteger)
    else:
        user_id, seq = sa.func.json_extract(signals.c.payload, "$.userId"), sa.func.json_extract(signals.c.payload, "$.seq")
    return (
        sa.select(sa.func.max(seq))
        .where(signals.c.state == signal_queries.PROCESSING, signals.c.origin == signal_queries.MESSAGE)
        .where(user_id == identities.c.user_id)
        .scalar_subquery()
    )


_LAST_INBOUND = (
    sa.select(sa.func.max(messages.c.seq))
    .where(messages.c.user_id == identities.c.user_id, INBOUND_ONLY)
    .scalar_subquery()
)
_CONVERSATION_FIELDS = len(private_conversations.c)


def _routes(dialect: str) -> sa.Select[Any]:
    """One statement (one round trip) on an outbound Message's path: each identity of the Users,
    with the User's conversations, most recent inbound seq and the seq being answered beside it."""
    return sa.select(
        identities.c.user_id, identities.c.identity, *private_conversations.c, *shared_conversations.c,
        _LAST_INBOUND, _answering_seq(dialect),
    ).select_from(
        identities.outerjoin(private_conversations, private_conversations.c.user_id == identities.c.user_id)
        .outerjoin(shared_conversations, shared_conversations.c.user_id == identities.c.user_id)
    )


# Straight on the driver (store.direct), the Users given as one parameter: a PostgreSQL array,
# a JSON array on SQLite.
_ROUTES_OF = {
    "postgresql": direct.Query(_routes("postgresql").where(
        identities.c.user_id == sa.any_(sa.cast(sa.bindparam("user_ids"), postgresql.ARRAY(sa.Text)))
    )),
    "sqlite": direct.Query(_routes("sqlite").where(identities.c.user_id.in_(
        sa.select(sa.column("value")).select_from(sa.func.json_each(sa.bindparam("user_ids")))
    ))),
}


def _conversation(fields: Sequence[Any]) -> Conversation | None:
    """The conversation in a row's ``fields`` (an outer join's: all null for none)."""
    return None if fields[0] is None else Conversation(*fields)


def _route(row: Sequence[Any], names: Sequence[str]) -> Route:
    """The Route of a row that reads, from its start, a User's private conversation, shared
    conversation, most recent inbound seq and seq being answered; ``names``: their identities."""
    n = _CONVERSATION_FIELDS
    last_inbound, answering = row[2 * n], row[2 * n + 1]
    return Route(_conversation(row[:n]), _conversation(row[n : 2 * n]), last_inbound, answering, tuple(names))


async def routes(conn: AsyncConnection, user_ids: Sequence[str]) -> dict[str, Route]:
    """The :class:`Route` of each User of ``user_ids`` that has an identity (others have none)."""
    linked: dict[str, list[str]] = {}
    rest: dict[str, Sequence[Any]] = {}
    given = list(user_ids) if conn.dialect.name == "postgresql" else orjson.dumps(list(user_ids)).decode()
    for user_id, name, *fields in await direct.run(conn, _ROUTES_OF[conn.dialect.name], user_ids=given):
        linked.setdefault(user_id, []).append(name)
        rest[user_id] = fields
    return {user_id: _route(rest[user_id], sorted(names)) for user_id, names in linked.items()}


# On PostgreSQL, the outbound Messages' writer reads their Users' routes in the statement that
# writes the Messages (store.queries.messages): no round trip of its own. That statement runs
# after the Users' logs are locked, so it sees every inbound Message committed before; not its
# own rows, whose inbound ones append_many_routed counts itself.
_CONVERSATION = ", ".join(f"{{0}}.{column.name}" for column in private_conversations.c)
_APPEND_MANY_ROUTED = message_queries.appending_many(
    f"SELECT a.id, a.seq, a.user_id, r.identities, {_CONVERSATION.format('c')}, {_CONVERSATION.format('s')}, "
    "r.last_inbound, r.answering "
    "FROM appended AS a CROSS JOIN woken "
    "LEFT JOIN (SELECT i.user_id, array_agg(i.identity ORDER BY i.identity) AS identities, "
    "(SELECT max(m.seq) FROM messages AS m WHERE m.user_id = i.user_id AND m.direction = 'inbound') AS last_inbound, "
    "(SELECT max(CAST(CAST(g.payload AS jsonb) ->> 'seq' AS bigint)) FROM signals AS g "
    f"WHERE g.state = '{signal_queries.PROCESSING}' AND g.origin = '{signal_queries.MESSAGE}' "
    "AND CAST(g.payload AS jsonb) ->> 'userId' = i.user_id) AS answering "
    "FROM channel_identities AS i WHERE i.user_id = ANY(:user_ids) GROUP BY i.user_id) AS r "
    "ON r.user_id = a.user_id "
    "LEFT JOIN channel_conversations AS c ON c.user_id = r.user_id "
    "LEFT JOIN channel_shared_conversations AS s ON s.user_id = r.user_id"
)


async def append_many_routed(
    conn: AsyncConnection, rows: Sequence[tuple[str, str, str, str, str]], wake: Callable[[str], str]
) -> tuple[list[message_queries.Message | None], dict[str, Route]]:
    """``store.queries.messages.append_many`` on PostgreSQL, and the :func:`routes` of the
    Users written to, as they are once these Messages are written: in one statement."""
    payloads = message_queries.wakes(conn, rows, wake)
    appended, returned = await message_queries.append_many_postgres(conn, _APPEND_MANY_ROUTED, rows, payloads)
    found: dict[str, Route] = {}
    for _, _, user_id, names, *fields in returned:
        if names is not None and user_id not in found:
            found[user_id] = _route(fields, names)
    for message in appended:  # an inbound Message written here is the most recent
        if message is not None and message.direction == "inbound" and message.user_id in found:
            route = found[message.user_id]
            found[message.user_id] = dataclasses.replace(route, last_inbound_seq=max(route.last_inbound_seq or 0, message.seq))
    return appended, found


async def read_position(conn: AsyncConnection, channel: str) -> str | None:
    return (await conn.execute(sa.select(positions.c.position).where(positions.c.channel == channel))).scalar()


async def set_read_position(conn: AsyncConnection, *, channel: str, position: str, now: str) -> None:
    await conn.execute(_upsert(conn, positions, {"channel": channel, "position": position, "updated_at": now}, "channel"))


# --- the outbox ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claimed(outbox.Claim):
    """A delivery a channel's sender holds until ``lease``."""

    position: int
    id: str
    channel: str
    identity: str
    conversation: str | None
    kind: str
    user_id: str | None
    message_id: str | None
    text: str
    created_at: str
    attempts: int
    retry_from: str
    lease: str


@dataclasses.dataclass(frozen=True)
class Delivery(outbox.Listed):
    """What the operator reads of a delivery (``agent-gateway channels deliveries``): never its text."""

    id: str
    channel: str
    identity: str
    kind: str
    message_id: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "channel": self.channel, "identity": self.identity, "kind": self.kind,
            "message": self.message_id, **super().to_json(),
        }


# A new delivery's columns, in the order insert() takes them (store.outbox.NewRows).
NEW_ROWS = outbox.NewRows("channel_deliveries", "channel_delivered", (
    ("id", "text"), ("channel", "text"), ("identity", "text"), ("conversation", "text"), ("kind", "text"),
    ("user_id", "text"), ("message_id", "text"), ("text", "text"), ("created_at", "text"),
    ("next_attempt_at", "text"), ("retry_from", "text"),
))
_OUTBOX = outbox.Outbox(
    deliveries,
    (
        deliveries.c.position, deliveries.c.id, deliveries.c.channel, deliveries.c.identity,
        deliveries.c.conversation, deliveries.c.kind, deliveries.c.user_id, deliveries.c.message_id,
        deliveries.c.text, deliveries.c.created_at, deliveries.c.attempts, deliveries.c.retry_from,
    ),
    partition=deliveries.c.channel,
)
# What retention removes (retention.deliveries_max_age, agent-gateway prune), as for webhooks:
# delivered and dead rows, closed before the cutoff (store.outbox keeps when in next_attempt_at).
OUTBOX = retention.Outbox(deliveries, closed=(DELIVERED, DEAD), ended=deliveries.c.next_attempt_at)


async def insert(conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], *, wake: str) -> None:
    """Record pending deliveries, each a tuple of :data:`NEW_ROWS`' columns, in the caller's
    transaction, and wake ``wake`` once it commits (on PostgreSQL written by its last statement)."""
    await NEW_ROWS.insert(conn, rows, channel=wake)


async def claim_due(conn: AsyncConnection, *, channel: str, now: str, lease: str, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` of ``channel``'s deliveries due at ``now``, oldest first, until ``lease``."""
    rows = await _OUTBOX.claim_due(conn, now=now, lease=lease, limit=limit, partition=channel)
    return sorted((Claimed(*row, lease=lease) for row in rows), key=lambda claimed: claimed.position)


async def record(
    store: Store, claimed: Claimed, error: str | None, backoff: outbox.Backoff
) -> tuple[str, datetime]:
    """Record how the attempt of a claimed delivery went (``store.outbox.Outbox.record``): its
    outcome and when."""
    return await _OUTBOX.record(store, claimed.held, error, retry_from=claimed.retry_from, backoff=backoff)


async def renew(store: Store, claimed: Claimed, *, lease: str) -> Claimed | None:
    """``claimed`` held until ``lease`` instead (``store.outbox.Outbox.renew``); None when its claim
    was lost (its lease ran out and another sender took it, or it was ended: an unlink)."""
    renewed = await _OUTBOX.renew(store, claimed.held, lease=lease)
    return dataclasses.replace(claimed, lease=lease) if renewed else None


# A claimed delivery's conversation as it is now, while it is still open and held by its claim; by
# state first (the state index), as every lookup by id here: the id has no index of its own.
_STILL_HELD = direct.Query(
    sa.select(deliveries.c.conversation).where(
        _OUTBOX.is_open, deliveries.c.next_attempt_at == sa.bindparam("lease"),
        deliveries.c.id == sa.bindparam("row_id"), deliveries.c.attempts == sa.bindparam("attempts"),
    )
)


async def still_held(store: Store, claimed: Claimed) -> Claimed | None:
    """``claimed`` with its conversation as it is now (:func:`forget_private` may have taken it
    off), while it is still open and held by its claim; None when something ended it meanwhile,
    such as an unlink (:func:`end_deliveries`)."""
    found = await store.fetch(_STILL_HELD, lease=claimed.lease, row_id=claimed.id, attempts=claimed.attempts)
    return dataclasses.replace(claimed, conversation=found[0][0]) if found else None


async def end_deliveries(conn: AsyncConnection, *, user_id: str, identity: str, error: str, now: str) -> int:
    """End, dead with ``error``, the open deliveries of ``user_id``'s Messages to ``identity``, in the
    caller's transaction (one being attempted too: its outcome is then not written); how many."""
    result = await conn.execute(
        deliveries.update()
        .where(_OUTBOX.is_open, deliveries.c.user_id == user_id, deliveries.c.identity == identity)
        .values(state=DEAD, next_attempt_at=now, last_error=error)  # when it closed, for retention
    )
    return result.rowcount


async def next_due(conn: AsyncConnection, *, channel: str) -> str | None:
    return await _OUTBOX.next_due(conn, partition=channel)


async def set_delivery_conversation(conn: AsyncConnection, *, id: str, conversation: str) -> None:
    """Write the conversation opened for a delivery that had none (so a retry uses it)."""
    await conn.execute(deliveries.update().where(deliveries.c.id == id).values(conversation=conversation))


async def notice_recorded(conn: AsyncConnection, *, channel: str, conversation: str, text: str) -> bool:
    """Whether the notice ``text`` is already in ``channel``'s outbox for ``conversation`` (sent or not)."""
    query = sa.select(deliveries.c.position).where(
        deliveries.c.channel == channel, deliveries.c.conversation == conversation,
        deliveries.c.kind == NOTICE, deliveries.c.text == text,
    )
    return (await conn.execute(query.limit(1))).first() is not None


async def depth(conn: AsyncConnection, *, channel: str) -> int:
    """How many of ``channel``'s deliveries are open (pending or failed)."""
    query = sa.select(sa.func.count()).where(_OUTBOX.is_open, deliveries.c.channel == channel)
    return int((await conn.execute(query)).scalar() or 0)


_LISTED = (
    *outbox.Listed.columns(deliveries), deliveries.c.id, deliveries.c.channel, deliveries.c.identity, deliveries.c.kind,
    deliveries.c.message_id,
)


async def newest(conn: AsyncConnection, *, limit: int, state: str | None = None) -> list[Delivery]:
    """Up to ``limit`` deliveries, newest first, in one ``state`` when given."""
    query = sa.select(*_LISTED).order_by(deliveries.c.position.desc()).limit(limit)
    if state is not None:
        query = query.where(deliveries.c.state == state)
    return [Delivery(*row) for row in await conn.execute(query)]
