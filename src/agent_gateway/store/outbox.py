"""The durable outbox, shared by every table of rows to send: webhook deliveries, channel deliveries.

A row is written in the transaction of what it reports (so a committed event
is always sent and a rolled-back one never is). It is ``pending`` until its
first attempt, ``failed`` while it waits for a retry, then ``delivered`` or
``dead``. A sender claims due rows by moving their ``next_attempt_at`` past
the attempt (the lease) in a committed transaction, so that no other sender
takes them meanwhile (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) and a sender
that dies leaves them due again when the lease ends. An outcome is written
only while its sender still holds that lease (the WHERE clause names it), so
two processes never both record one attempt.

An outbox table has the columns ``position`` (insertion order), ``id``,
``state``, ``attempts``, ``next_attempt_at``, ``retry_from``, ``last_error``
and ``delivered_at``, and an index on ``(state, next_attempt_at)``. A closed
row (``delivered``, ``dead``) keeps in ``next_attempt_at`` when it closed,
which retention reads (``store.queries.retention.Outbox``). Each
area's queries (``store.queries.webhooks``, ``store.queries.channels``) build
an :class:`Outbox` on theirs and say what a claim returns.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock
from agent_gateway.store import direct, engine
from agent_gateway.store.engine import Store

PENDING, FAILED, DELIVERED, DEAD = "pending", "failed", "delivered", "dead"
STATES = (PENDING, FAILED, DELIVERED, DEAD)
# The states a sender may claim a row in.
OPEN = (PENDING, FAILED)


@dataclasses.dataclass(frozen=True)
class Listed:
    """Where one row of any outbox stands, as the operator's commands list it (never what it sends).

    An area's listed delivery adds what names it; :meth:`columns` are this part's columns, first in
    its query, so that a row builds the whole record positionally.
    """

    state: str
    attempts: int
    created_at: str
    next_attempt_at: str
    last_error: str | None
    delivered_at: str | None

    @staticmethod
    def columns(table: sa.Table) -> tuple[sa.Column[Any], ...]:
        return (
            table.c.state, table.c.attempts, table.c.created_at, table.c.next_attempt_at, table.c.last_error,
            table.c.delivered_at,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state, "attempts": self.attempts, "createdAt": self.created_at,
            # While open, when it is next tried; once delivered or dead, when it closed (not shown).
            "nextAttemptAt": self.next_attempt_at if self.state in OPEN else None,
            "lastError": self.last_error, "deliveredAt": self.delivered_at,
        }


# Rows per SQLite statement, well under its limit of bound values (32,766).
SQLITE_ROWS = 512


class NewRows:
    """How an outbox table's new rows are written, ``pending`` with no attempt, in no round trip
    of their own where the database allows it.

    On SQLite, one multi-row ``VALUES`` list per :data:`SQLITE_ROWS` rows, run on the driver:
    SQLite runs it once, where an executemany resets and steps a statement for each row. On
    PostgreSQL, a data-modifying WITH clause named ``name`` over one array per column
    (:attr:`with_clause`, :meth:`arrays`), which another statement carries: the one that writes
    the event they report, or the one that sends the transaction's NOTIFY (``engine.carry``);
    their array parameters are named after ``name``, so that two outboxes' rows can share one.
    ``columns`` are ``(name, PostgreSQL type)`` in the order each row's values are given.
    """

    def __init__(self, table: str, name: str, columns: Sequence[tuple[str, str]]) -> None:
        self.table = table
        self.columns = tuple(column for column, _ in columns)
        self._params = tuple(f"{name}_{column}" for column in self.columns)
        arrays = ", ".join(f"CAST(:{param} AS {kind}[])" for param, (_, kind) in zip(self._params, columns, strict=True))
        names = ", ".join(self.columns)
        self.with_clause = (
            f"{name} AS (INSERT INTO {table} ({names}, state, attempts) "
            f"SELECT {names}, '{PENDING}', 0 FROM unnest({arrays}) AS r({names}))"
        )
        self._carried = engine.Carried(self.with_clause, self.arrays)
        # Outside a Store's transaction, which sends no wake-up: the rows alone.
        self._alone = direct.Query(sa.text(f"WITH {self.with_clause} SELECT 1"))

    def arrays(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
        """The parameters of :attr:`with_clause` for ``rows``."""
        return dict(zip(self._params, (list(column) for column in zip(*rows, strict=True)), strict=True))

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a few instances, made once at import)
    def sqlite(self, count: int) -> str:
        """The SQLite statement writing ``count`` rows (state and attempts written into it, not bound)."""
        row = f"({', '.join('?' * len(self.columns))}, '{PENDING}', 0)"
        return f"INSERT INTO {self.table} ({', '.join(self.columns)}, state, attempts) VALUES {', '.join([row] * count)}"

    async def insert(self, conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], *, channel: str) -> None:
        """Write ``rows`` in the caller's transaction and wake ``channel`` once it commits. On
        PostgreSQL the transaction's last statement writes them: until then it does not see them."""
        if not rows:
            return
        if conn.dialect.name != "postgresql":
            for start in range(0, len(rows), SQLITE_ROWS):
                chunk = rows[start : start + SQLITE_ROWS]
                await direct.run_sqlite(conn, self.sqlite(len(chunk)), [value for row in chunk for value in row])
            engine.notify(conn, channel)
            return
        if engine.carry(conn, self._carried, rows, channel):
            return
        await direct.run(conn, self._alone, **self.arrays(rows))


def next_attempt(
    attempts: int,
    now: datetime,
    retry_from: datetime,
    *,
    first_retry_s: float,
    retry_for: timedelta,
    factor: float,
    max_wait_s: float,
) -> datetime | None:
    """When to try again after the ``attempts``-th failed attempt: ``first_retry_s × factor^(n-1)``
    later, at most ``max_wait_s``; None when that would be past ``retry_from + retry_for`` (dead)."""
    wait = min(first_retry_s * factor ** (attempts - 1), max_wait_s)
    following = now + timedelta(seconds=wait)
    return None if following > retry_from + retry_for else following


# When a sender tries a row again after its n-th failed attempt, from now and the row's
# retry_from (next_attempt with the sender's figures); None: never, the row is dead.
Backoff = Callable[[int, datetime, datetime], datetime | None]


@dataclasses.dataclass(frozen=True)
class Held:
    """What names one claimed attempt: the row, its attempt count and its lease at the claim."""

    id: str
    attempts: int
    lease: str


class Claim:
    """An area's claimed delivery (a dataclass with these three among its fields): :attr:`held`
    names its attempt for :meth:`Outbox.renew` and :meth:`Outbox.record`."""

    id: str
    attempts: int
    lease: str

    @property
    def held(self) -> Held:
        return Held(self.id, self.attempts, self.lease)


class Outbox:
    """The claim, outcome and due-time statements of one outbox ``table``; a claim returns
    ``claimed`` columns (``position`` first, ``attempts`` among them). With a ``partition``
    column, claims and due times are of one value of it (``partition=`` at each call)."""

    def __init__(
        self, table: sa.Table, claimed: Sequence[sa.Column[Any]], *, partition: sa.Column[Any] | None = None
    ) -> None:
        self.table = table
        c = table.c
        # As two comparisons: an IN list is expanded per execution, which a direct.Query is not.
        self.is_open = sa.or_(*(c.state == state for state in OPEN))
        # Several senders of different kinds share a table (each chat channel sends only its own
        # rows): their claims and due times name their partition.
        self._mine = () if partition is None else (partition == sa.bindparam("partition"),)
        self._claim = {dialect: direct.Query(self._claim_statement(dialect, claimed)) for dialect in ("sqlite", "postgresql")}
        held = sa.and_(
            c.id == sa.bindparam("row_id"),
            self.is_open,
            c.attempts == sa.bindparam("held_attempts"),
            c.next_attempt_at == sa.bindparam("held_lease"),
        )
        self._delivered = direct.Query(
            table.update().where(held)
            .values(state=DELIVERED, delivered_at=sa.bindparam("at"), next_attempt_at=sa.bindparam("at"), last_error=None)
            .returning(c.id)
        )
        self._failed = direct.Query(
            table.update().where(held)
            .values(state=sa.bindparam("new_state"), next_attempt_at=sa.bindparam("next_at"), last_error=sa.bindparam("error"))
            .returning(c.id)
        )
        # A claim's lease moved on, only while the claim is still held (for an attempt that starts late).
        self._renew = direct.Query(table.update().where(held).values(next_attempt_at=sa.bindparam("lease")).returning(c.id))
        self._next_due = sa.select(sa.func.min(c.next_attempt_at)).where(self.is_open, *self._mine)

    def _claim_statement(self, dialect: str, claimed: Sequence[sa.Column[Any]]) -> sa.Update:
        c = self.table.c
        due = (
            sa.select(c.position)
            .where(self.is_open, *self._mine, c.next_attempt_at <= sa.bindparam("now"))
            .order_by(c.position)
            .limit(sa.bindparam("limit"))
        )
        if dialect == "postgresql":
            # Another sender claiming at the same moment takes other rows instead of waiting.
            due = due.with_for_update(skip_locked=True)
        return (
            self.table.update()
            .where(c.position.in_(due.scalar_subquery()), self.is_open)
            .values(attempts=c.attempts + 1, next_attempt_at=sa.bindparam("lease"))
            .returning(*claimed)
        )

    async def claim_due(
        self, conn: AsyncConnection, *, now: str, lease: str, limit: int, partition: Any = None
    ) -> Sequence[Sequence[Any]]:
        """Claim up to ``limit`` rows due at ``now``, until ``lease``; each claim counts as an attempt.
        Rows in no particular order: the caller sorts by position."""
        extra = {} if partition is None else {"partition": partition}
        return await direct.run(conn, self._claim[conn.dialect.name], now=now, lease=lease, limit=limit, **extra)

    async def record(
        self, store: Store, held: Held, error: str | None, *, retry_from: str, backoff: Backoff
    ) -> tuple[str, datetime]:
        """Record how one claimed attempt went, in a transaction of its own, while its lease is
        still held: delivered when ``error`` is None, else failed and retried when ``backoff``
        (:func:`next_attempt` with a sender's figures) gives a time, else dead. The outcome
        (``delivered``, ``failed``, ``dead``, or ``superseded`` when the lease was lost meanwhile:
        the outcome is another attempt's, and nothing was written) and when it was recorded. A
        closed row keeps that time in ``next_attempt_at``, which retention reads."""
        now = clock.now()
        at = clock.format_instant(now)
        following = None if error is None else backoff(held.attempts, now, clock.parse_instant(retry_from))
        if error is None:
            statement, outcome, values = self._delivered, DELIVERED, {"at": at}
        elif following is not None:
            statement, outcome = self._failed, FAILED
            values = {"new_state": FAILED, "next_at": clock.format_instant(following), "error": error}
        else:
            statement, outcome, values = self._failed, DEAD, {"new_state": DEAD, "next_at": at, "error": error}
        async with store.transaction() as conn:
            still_held = bool(await direct.run(conn, statement, **values, **_params(held)))
        return (outcome if still_held else "superseded"), now

    async def renew(self, store: Store, held: Held, *, lease: str) -> bool:
        """Hold the claimed row until ``lease`` instead, in a transaction of its own; False when its
        claim was lost meanwhile (its lease ran out and another sender claimed it, or it was closed)."""
        async with store.transaction() as conn:
            return bool(await direct.run(conn, self._renew, lease=lease, **_params(held)))

    async def next_due(self, conn: AsyncConnection, *, partition: Any = None) -> str | None:
        """When the earliest open row is due (a lease's end for one being sent); None when none is open."""
        extra = {} if partition is None else {"partition": partition}
        return (await conn.execute(self._next_due, extra)).scalar()


def _params(held: Held) -> dict[str, Any]:
    return {"row_id": held.id, "held_attempts": held.attempts, "held_lease": held.lease}
