"""Queries that remove ended Signals and their Runs, and outboxes' closed rows (``agent-gateway prune``).

A Signal has ended when it is ``done`` or ``failed``; it ended when its last
Run did, or when it was emitted if it had none (a Signal no Handler turned
into Runs ends as it is taken). Both states are final (the one-way rule), so
no writer touches such rows any more and removing them races with nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.queries.signals import DONE, FAILED
from agent_gateway.store.tables import runs, signals

ENDED = (DONE, FAILED)


def _ended_before(cutoff: str) -> sa.ColumnElement[bool]:
    """Signals that ended before ``cutoff``: a final state, emitted before it, and no Run
    unfinished or ended at or after it."""
    later_run = sa.exists().where(
        runs.c.signal_id == signals.c.id, sa.or_(runs.c.ended_at.is_(None), runs.c.ended_at >= cutoff)
    )
    return sa.and_(signals.c.state.in_(ENDED), signals.c.emitted_at < cutoff, ~later_run)


async def count_ended(conn: AsyncConnection, *, cutoff: str) -> tuple[int, int]:
    """How many Signals ended before ``cutoff``, and how many Runs they have."""
    ended = sa.select(signals.c.id).where(_ended_before(cutoff))
    signal_count = (await conn.execute(sa.select(sa.func.count()).select_from(ended.subquery()))).scalar_one()
    run_count = (
        await conn.execute(sa.select(sa.func.count()).select_from(runs).where(runs.c.signal_id.in_(ended)))
    ).scalar_one()
    return signal_count, run_count


async def delete_ended(conn: AsyncConnection, *, cutoff: str, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` of the oldest Signals that ended before ``cutoff``, their Runs first;
    return how many Signals and Runs went."""
    batch = sa.select(signals.c.id).where(_ended_before(cutoff)).order_by(signals.c.position).limit(limit)
    if conn.dialect.name == "postgresql":
        # Another pruner at the same moment takes other rows rather than waiting on these.
        batch = batch.with_for_update(skip_locked=True)
    ids = list((await conn.execute(batch)).scalars())
    if not ids:
        return 0, 0
    run_count = (await conn.execute(runs.delete().where(runs.c.signal_id.in_(ids)))).rowcount
    signal_count = (
        await conn.execute(signals.delete().where(signals.c.id.in_(ids), signals.c.state.in_(ENDED)))
    ).rowcount
    return signal_count, run_count


@dataclasses.dataclass(frozen=True)
class Outbox:
    """An outbox whose closed rows retention removes: the webhook deliveries, and any outbox a
    later area adds (a chat channel's) by declaring one of these beside its queries.

    ``closed`` are its final states (a row in one is never claimed again, though an operator's
    retry may reopen it, which the delete's WHERE clause re-checks); ``ended`` is the column
    that says, at the latest, when a closed row was closed: rows older than the cutoff there go.
    Rows in any other state (pending, retrying) are never removed.
    """

    table: sa.Table
    closed: tuple[str, ...]
    ended: sa.Column[Any]

    def _closed_before(self, cutoff: str) -> sa.ColumnElement[bool]:
        return sa.and_(self.table.c.state.in_(self.closed), self.ended < cutoff)


async def count_closed(conn: AsyncConnection, outbox: Outbox, *, cutoff: str) -> int:
    """How many of ``outbox``'s rows were closed before ``cutoff``."""
    query = sa.select(sa.func.count()).select_from(outbox.table).where(outbox._closed_before(cutoff))
    return (await conn.execute(query)).scalar_one()


async def delete_closed(conn: AsyncConnection, outbox: Outbox, *, cutoff: str, limit: int) -> int:
    """Delete up to ``limit`` of ``outbox``'s rows closed before ``cutoff``; return how many went.

    No ORDER BY: any closed rows will do, and without one the (state, ended) index answers the
    batch without sorting every candidate.
    """
    [key] = outbox.table.primary_key.columns
    batch = sa.select(key).where(outbox._closed_before(cutoff)).limit(limit)
    if conn.dialect.name == "postgresql":
        batch = batch.with_for_update(skip_locked=True)
    keys = list((await conn.execute(batch)).scalars())
    if not keys:
        return 0
    deleted = outbox.table.delete().where(key.in_(keys), outbox.table.c.state.in_(outbox.closed))
    return (await conn.execute(deleted)).rowcount
