"""Queries on the webhook outbox: one row per delivery of one event to one endpoint.

Its states, claims, leases and outcomes are the shared outbox's (``store.outbox``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import direct, engine, notifications, outbox
from agent_gateway.store.queries import retention
from agent_gateway.store.outbox import DEAD, DELIVERED, FAILED, OPEN, PENDING, STATES  # noqa: F401 (this area's names)
from agent_gateway.store.tables import webhook_deliveries as deliveries
# What retention removes (retention.deliveries_max_age, agent-gateway prune): delivered and dead
# rows closed before the cutoff. Both outcomes set next_attempt_at to when the row closed (no
# attempt follows: store.outbox), so the (state, next_attempt_at) index finds them without a
# column of its own.
OUTBOX = retention.Outbox(deliveries, closed=(DELIVERED, DEAD), ended=deliveries.c.next_attempt_at)


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A delivery a sender holds until ``lease`` (its ``next_attempt_at`` now)."""

    position: int
    id: str
    url: str
    event: str
    body: str | None  # None: composed from the Decision ``decision_seq`` (webhooks.outbox.composed)
    decision_seq: int | None
    created_at: str
    attempts: int
    retry_from: str
    lease: str


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What the operator reads of a delivery (``agent-gateway webhooks deliveries``)."""

    id: str
    url: str
    event: str
    state: str
    attempts: int
    created_at: str
    next_attempt_at: str
    last_error: str | None
    delivered_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "event": self.event,
            "state": self.state,
            "attempts": self.attempts,
            "createdAt": self.created_at,
            # While open, when it is next tried; once delivered or dead, when it closed (not shown).
            "nextAttemptAt": self.next_attempt_at if self.state in OPEN else None,
            "lastError": self.last_error,
            "deliveredAt": self.delivered_at,
        }


# The columns a new delivery is written with, in the order insert() takes them.
COLUMNS = ("id", "url", "event", "body", "decision_seq", "created_at", "next_attempt_at", "retry_from")


@functools.lru_cache(maxsize=64)
def _sqlite_insert(count: int) -> str:
    # One statement for all the rows: SQLite runs a multi-row VALUES list once, where an
    # executemany resets and steps a statement for each row (a fifth less time per row).
    # The state and attempts are written into it, not bound: each row binds only its own values.
    row = f"({', '.join('?' * len(COLUMNS))}, '{PENDING}', 0)"
    return f"INSERT INTO webhook_deliveries ({', '.join(COLUMNS)}, state, attempts) VALUES {', '.join([row] * count)}"


# Rows per SQLite statement, well under its limit of bound values (32,766).
_SQLITE_ROWS = 512
# On PostgreSQL the rows go in as a data-modifying WITH clause of another statement: the one
# that writes their event (store.queries.decisions) or the one that sends their transaction's NOTIFY
# (engine.carry), so that they cost no round trip of their own.
POSTGRES_WITH = (
    "delivered AS (INSERT INTO webhook_deliveries "
    "(id, url, event, body, decision_seq, created_at, state, attempts, next_attempt_at, retry_from) "
    f"SELECT d.id, d.url, d.event, d.body, d.decision_seq, d.created_at, '{PENDING}', 0, d.next_attempt_at, "
    "d.retry_from FROM unnest(CAST(:ids AS text[]), CAST(:urls AS text[]), CAST(:events AS text[]), "
    "CAST(:bodies AS text[]), CAST(:decision_seqs AS bigint[]), CAST(:created_ats AS text[]), "
    "CAST(:next_attempt_ats AS text[]), CAST(:retry_froms AS text[])) "
    "AS d(id, url, event, body, decision_seq, created_at, next_attempt_at, retry_from))"
)
# The NOTIFY that ends such a statement (its payload None: none).
POSTGRES_NOTIFY = "SELECT pg_notify(:channel, :payload) WHERE CAST(:payload AS text) IS NOT NULL"
_ARRAYS = ("ids", "urls", "events", "bodies", "decision_seqs", "created_ats", "next_attempt_ats", "retry_froms")


def postgres_arrays(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The parameters of :data:`POSTGRES_WITH` for ``rows`` (as :func:`insert` takes them)."""
    return dict(zip(_ARRAYS, (list(column) for column in zip(*rows, strict=True)), strict=True))


_CARRIED = engine.Carried(POSTGRES_WITH, postgres_arrays)
_POSTGRES_INSERT = direct.Query(sa.text(f"WITH {POSTGRES_WITH} {POSTGRES_NOTIFY}"))


async def insert(conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], *, channel: str) -> None:
    """Record pending deliveries, each a tuple of the :data:`COLUMNS` (one of ``body`` and
    ``decision_seq`` None), in order, in the caller's transaction, and wake ``channel`` once
    it commits.

    On PostgreSQL they are written by the transaction's last statement (``engine.carry``):
    until then this transaction does not see them.
    """
    if conn.dialect.name != "postgresql":
        for start in range(0, len(rows), _SQLITE_ROWS):
            chunk = rows[start : start + _SQLITE_ROWS]
            await direct.run_sqlite(conn, _sqlite_insert(len(chunk)), [value for row in chunk for value in row])
        engine.notify(conn, channel)
        return
    if engine.carry(conn, _CARRIED, rows, channel):
        return
    await direct.run(conn, _POSTGRES_INSERT, channel=notifications.PG_CHANNEL, payload=None, **postgres_arrays(rows))


_OUTBOX = outbox.Outbox(deliveries, (
    deliveries.c.position, deliveries.c.id, deliveries.c.url, deliveries.c.event, deliveries.c.body,
    deliveries.c.decision_seq, deliveries.c.created_at, deliveries.c.attempts, deliveries.c.retry_from,
))


async def claim_due(conn: AsyncConnection, *, now: str, lease: str, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` deliveries due at ``now``, oldest first, until ``lease``; each
    claim counts as an attempt."""
    rows = await _OUTBOX.claim_due(conn, now=now, lease=lease, limit=limit)
    return sorted((Claimed(*row, lease=lease) for row in rows), key=lambda claimed: claimed.position)


async def record(
    store: engine.Store, claimed: Claimed, error: str | None, backoff: outbox.Backoff
) -> tuple[str, datetime]:
    """Record how the attempt of a claimed delivery went (``store.outbox.Outbox.record``): its
    outcome and when."""
    return await _OUTBOX.record(store, _held(claimed), error, retry_from=claimed.retry_from, backoff=backoff)


def _held(claimed: Claimed) -> outbox.Held:
    return outbox.Held(claimed.id, claimed.attempts, claimed.lease)


async def next_due(conn: AsyncConnection) -> str | None:
    """When the earliest open delivery is due (a lease's end for one being sent); None when none is open."""
    return await _OUTBOX.next_due(conn)


_LISTED = (
    deliveries.c.id, deliveries.c.url, deliveries.c.event, deliveries.c.state, deliveries.c.attempts,
    deliveries.c.created_at, deliveries.c.next_attempt_at, deliveries.c.last_error, deliveries.c.delivered_at,
)


async def newest(conn: AsyncConnection, *, limit: int, state: str | None = None) -> list[Delivery]:
    """Up to ``limit`` deliveries, newest event first, in one ``state`` when given."""
    query = sa.select(*_LISTED).order_by(deliveries.c.position.desc()).limit(limit)
    if state is not None:
        query = query.where(deliveries.c.state == state)
    return [Delivery(*row) for row in await conn.execute(query)]


async def get(conn: AsyncConnection, *, id: str) -> Delivery | None:
    """The delivery ``id``, in any state: a scan of the table, as no index leads with the id
    (the operator's ``webhooks retry`` reads it only to say why it refused)."""
    row = (await conn.execute(sa.select(*_LISTED).where(deliveries.c.id == id))).first()
    return None if row is None else Delivery(*row)


async def retry(conn: AsyncConnection, *, id: str, now: str) -> Delivery | None:
    """Make a ``failed`` or ``dead`` delivery due now, with a fresh retry period, and return it;
    None when it is in neither state (nothing written). Found through the state index."""
    query = (
        deliveries.update()
        .where(deliveries.c.state.in_((FAILED, DEAD)), deliveries.c.id == id)
        .values(state=PENDING, attempts=0, next_attempt_at=now, retry_from=now)
        .returning(*_LISTED)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else Delivery(*row)
