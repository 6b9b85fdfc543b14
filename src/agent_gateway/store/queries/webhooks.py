"""Queries on the webhook outbox: one row per delivery of one event to one endpoint.

Its states, claims, leases and outcomes are the shared outbox's (``store.outbox``); claims
and due times are of one endpoint's URL, as each endpoint is sent to on its own
(``webhooks.deliverer``), and a claim's lease can be renewed for an attempt that
starts late (:func:`renew`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import engine, outbox
from agent_gateway.store.queries import retention
from agent_gateway.store.outbox import DEAD, DELIVERED, FAILED, OPEN, PENDING, STATES  # noqa: F401 (this area's names)
from agent_gateway.store.tables import webhook_deliveries as deliveries
# What retention removes (retention.deliveries_max_age, agent-gateway prune): delivered and dead
# rows closed before the cutoff. Both outcomes set next_attempt_at to when the row closed (no
# attempt follows: store.outbox), so the (state, next_attempt_at) index finds them without a
# column of its own.
OUTBOX = retention.Outbox(deliveries, closed=(DELIVERED, DEAD), ended=deliveries.c.next_attempt_at)


@dataclasses.dataclass(frozen=True)
class Claimed(outbox.Claim):
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
class Delivery(outbox.Listed):
    """What the operator reads of a delivery (``agent-gateway webhooks deliveries``)."""

    id: str
    url: str
    event: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "event": self.event, **super().to_json()}


# A new delivery's columns, in the order insert() takes them. On PostgreSQL its rows go in as a
# WITH clause of another statement: the one that writes their event (store.queries.decisions)
# or the one that sends their transaction's NOTIFY (store.outbox.NewRows).
NEW_ROWS = outbox.NewRows("webhook_deliveries", "delivered", (
    ("id", "text"), ("url", "text"), ("event", "text"), ("body", "text"), ("decision_seq", "bigint"),
    ("created_at", "text"), ("next_attempt_at", "text"), ("retry_from", "text"),
))


async def insert(conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], *, channel: str) -> None:
    """Record pending deliveries, each a tuple of :data:`NEW_ROWS`' columns (one of ``body`` and
    ``decision_seq`` None), in order, in the caller's transaction, and wake ``channel`` once it
    commits (on PostgreSQL written by the transaction's last statement)."""
    await NEW_ROWS.insert(conn, rows, channel=channel)


_OUTBOX = outbox.Outbox(deliveries, (
    deliveries.c.position, deliveries.c.id, deliveries.c.url, deliveries.c.event, deliveries.c.body,
    deliveries.c.decision_seq, deliveries.c.created_at, deliveries.c.attempts, deliveries.c.retry_from,
), partition=deliveries.c.url)


async def claim_due(conn: AsyncConnection, *, url: str, now: str, lease: str, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` deliveries to ``url`` due at ``now``, oldest first, until ``lease``;
    each claim counts as an attempt."""
    rows = await _OUTBOX.claim_due(conn, now=now, lease=lease, limit=limit, partition=url)
    return sorted((Claimed(*row, lease=lease) for row in rows), key=lambda claimed: claimed.position)


async def renew(store: engine.Store, claimed: Claimed, *, lease: str) -> Claimed | None:
    """``claimed`` held until ``lease`` instead (``store.outbox.Outbox.renew``); None when its claim was lost."""
    renewed = await _OUTBOX.renew(store, claimed.held, lease=lease)
    return dataclasses.replace(claimed, lease=lease) if renewed else None


async def record(
    store: engine.Store, claimed: Claimed, error: str | None, backoff: outbox.Backoff
) -> tuple[str, datetime]:
    """Record how the attempt of a claimed delivery went (``store.outbox.Outbox.record``): its
    outcome and when."""
    return await _OUTBOX.record(store, claimed.held, error, retry_from=claimed.retry_from, backoff=backoff)


async def next_due(conn: AsyncConnection, *, url: str) -> str | None:
    """When the earliest open delivery to ``url`` is due (a lease's end for one being sent); None
    when none is open."""
    return await _OUTBOX.next_due(conn, partition=url)


async def open_urls(conn: AsyncConnection) -> list[str]:
    """The URLs that open deliveries are to (found through the state index)."""
    query = sa.select(deliveries.c.url).where(_OUTBOX.is_open).distinct().order_by(deliveries.c.url)
    return list((await conn.execute(query)).scalars())


_LISTED = (*outbox.Listed.columns(deliveries), deliveries.c.id, deliveries.c.url, deliveries.c.event)


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
