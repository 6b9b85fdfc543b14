"""Queries on Signals.

Every state change is one UPDATE whose WHERE clause names the state it leaves,
so the one-way rule (spec: Signal states) is the database's, not Python's: a
transition from the wrong state changes nothing and returns nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import jsontext, records
from agent_gateway.store import direct, engine
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.tables import signals

PENDING, PROCESSING, DONE, FAILED = "pending", "processing", "done", "failed"
# What emitted a Signal: a Message, a Schedule's fire, or the operator's own code (anything else).
MESSAGE, SCHEDULE, OPERATOR = "message", "schedule", "operator"
STATES = (PENDING, PROCESSING, DONE, FAILED)


@dataclasses.dataclass(frozen=True)
class Signal:
    id: str
    kind: str
    payload: Any
    emitted_at: str
    state: str
    error: str | None
    # What emitted it (ORIGINS); not in the spec's record: the Run ledger records it.
    origin: str = "operator"

    def to_json(self) -> records.Signal:
        return {
            "id": self.id,
            "kind": self.kind,
            "payload": self.payload,
            "emittedAt": self.emitted_at,
            "state": self.state,
            "error": self.error,
        }

    @classmethod
    def from_row(cls, row: sa.Row) -> Signal:
        return cls(row.id, row.kind, row.payload, row.emitted_at, row.state, row.error, row.origin)

    @classmethod
    def from_driver(cls, row: Sequence[Any]) -> Signal:
        """From a row of :data:`_COLUMNS` as the driver gives it (see ``store.direct``): the payload is JSON text."""
        id, kind, payload, emitted_at, state, error, origin = row
        return cls(id, kind, jsontext.loads(payload), emitted_at, state, error, origin)


_COLUMNS = (
    signals.c.id, signals.c.kind, signals.c.payload, signals.c.emitted_at, signals.c.state, signals.c.error,
    signals.c.origin,
)
# Queue order: emittedAt, ties broken by the insert's number.
_QUEUE_ORDER = (signals.c.emitted_at.asc(), signals.c.position.asc())
_NEWEST_FIRST = (signals.c.emitted_at.desc(), signals.c.position.desc())


# The worker's statements are built once: building one per call costs more than running it.
_INSERT = signals.insert()


def _claim(dialect: str) -> sa.Update:
    oldest = sa.select(signals.c.position).where(signals.c.state == PENDING).order_by(*_QUEUE_ORDER).limit(1)
    if dialect == "postgresql":
        # Another process claiming at the same moment takes the next one instead of waiting.
        oldest = oldest.with_for_update(skip_locked=True)
    return (
        signals.update()
        .where(signals.c.position == oldest.scalar_subquery(), signals.c.state == PENDING)
        .values(state=PROCESSING)
        .returning(*_COLUMNS)
    )


# The worker's transitions run straight on the driver (see store.direct): they are its hot path.
_CLAIM = {dialect: direct.Query(_claim(dialect)) for dialect in ("sqlite", "postgresql")}
_FINISH = direct.Query(
    signals.update()
    .where(signals.c.id == sa.bindparam("signal_id"), signals.c.state == PROCESSING)
    .values(state=sa.bindparam("signal_state"), error=sa.bindparam("signal_error"))
    .returning(signals.c.id)
)


def ended() -> tuple[sa.CTE, sa.CTE]:
    """A Run's end and its Signal's as data-modifying CTEs of a PostgreSQL statement (parameters
    from :func:`ending`), run once and to completion whatever else it does; every part of it
    sees its one snapshot, in which the ended Signal is processing, not pending, so it is never
    claimed there.

    A Run the operator cancelled (no longer ``running``) is not ended again: then the Signal
    ends ``failed`` with ``signal_error_if_cancelled``, whatever the Run's program did.
    """
    ended_run = run_queries.FINISH.statement.cte("ended_run")
    ran = sa.exists(sa.select(ended_run.c.id))
    ended_signal = (
        signals.update()
        .where(signals.c.id == sa.bindparam("signal_id"), signals.c.state == PROCESSING)
        .values(
            state=sa.case((ran, sa.bindparam("signal_state", type_=sa.String)), else_=FAILED),
            error=sa.case(
                (ran, sa.bindparam("signal_error", type_=sa.String)),
                else_=sa.bindparam("signal_error_if_cancelled", type_=sa.String),
            ),
        )
        .returning(signals.c.id)
        .cte("ended_signal")
    )
    return ended_run, ended_signal


# On PostgreSQL a Run's end, its Signal's end and the next claim are one statement: each
# statement costs a round trip, most of what the worker waits for per Signal.
_END_AND_CLAIM = direct.Query(_claim("postgresql").add_cte(*ended()))
# The oldest pending Signal and its place in the queue, read outside any transaction.
_OLDEST = sa.select(signals.c.position, *_COLUMNS).where(signals.c.state == PENDING).order_by(*_QUEUE_ORDER).limit(1)
_OLDEST_PENDING = direct.Query(_OLDEST)
# The ends alone, answering the oldest pending Signal as the statement saw it, for a worker that
# claims by what it read ahead (signals.worker).
_END = direct.Query(_OLDEST.add_cte(*ended()))


def claiming(condition: sa.ColumnElement[bool]) -> sa.CTE:
    """A PostgreSQL statement's claim of the Signal ``claim_id`` (parameters from
    :func:`claim_params`) as a CTE ``claimed`` returning its id: only while it is pending, no
    Signal pending is older (the queue's order holds however long ago it was read) and
    ``condition`` holds. A Signal claimed so is the one :func:`claim_oldest` would have claimed."""
    older = signals.alias("older")
    queued_before = sa.tuple_(older.c.emitted_at, older.c.position) < sa.tuple_(
        sa.bindparam("claim_emitted_at", type_=signals.c.emitted_at.type),
        sa.bindparam("claim_position", type_=sa.BigInteger),
    )
    return (
        signals.update()
        .where(
            # Found by its primary key: by its id or state a plan may scan the pending ones.
            signals.c.position == sa.bindparam("claim_position", type_=sa.BigInteger),
            signals.c.id == sa.bindparam("claim_id"), signals.c.state == PENDING, condition,
            ~sa.exists().where(older.c.state == PENDING, queued_before),
        )
        .values(state=PROCESSING)
        .returning(signals.c.id)
        .cte("claimed")
    )


def with_next(claimed: sa.CTE) -> sa.Select:
    """A PostgreSQL statement's answer around :func:`claiming`'s CTE: whether it claimed, then the
    oldest pending Signal after that one as the statement saw it (:func:`claimed_and_next`), so a
    worker reading ahead need not read it again."""
    after = _OLDEST.where(signals.c.id != sa.bindparam("claim_id")).subquery("next")
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    return sa.select(sa.exists(claimed.select()), *after.c).select_from(one.outerjoin(after, sa.true()))


def claimed_and_next(row: Sequence[Any]) -> tuple[bool, Queued | None]:
    """The row a :func:`with_next` statement answers: whether it claimed, and the Signal next."""
    claimed, *queued = row
    return bool(claimed), _queued(queued)


@dataclasses.dataclass(frozen=True)
class Queued:
    """A pending Signal as read, and its place in the queue (:func:`oldest_pending`)."""

    signal: Signal
    position: int

    def claim_params(self) -> dict[str, object]:
        """The parameters of :func:`claiming`."""
        return {"claim_id": self.signal.id, "claim_emitted_at": self.signal.emitted_at, "claim_position": self.position}


async def oldest_pending(store: Store) -> Queued | None:
    """The oldest pending Signal, read outside any transaction (what :func:`claim_oldest` would claim now)."""
    rows = await store.fetch(_OLDEST_PENDING)
    return _queued(rows[0]) if rows else None


def _queued(row: Sequence[Any]) -> Queued | None:
    """A row of :data:`_OLDEST`'s columns; None when they are null (an outer join's nothing)."""
    position, *columns = row
    return None if position is None else Queued(Signal.from_driver(columns), int(position))


async def insert(conn: AsyncConnection, *, id: str, kind: str, payload: Any, emitted_at: str, origin: str = OPERATOR) -> None:
    await insert_many(conn, [(id, kind, payload, emitted_at)], origin=origin)


def _carried_arrays(rows: list[tuple[str, str, str, str, str]]) -> dict[str, list[str]]:
    ids, kinds, payloads, emitted_at, origins = (list(column) for column in zip(*rows, strict=True))
    return {
        "signal_ids": ids, "signal_kinds": kinds, "signal_payloads": payloads, "signal_emitted_at": emitted_at,
        "signal_origins": origins,
    }


# Pending Signals as a data-modifying WITH clause of the statement that sends a transaction's
# NOTIFY (engine.carry), with their parameters from _carried_arrays.
_CARRIED = engine.Carried(
    "new_signals AS (INSERT INTO signals (id, kind, payload, emitted_at, state, origin) "
    f"SELECT id, kind, payload, emitted_at, '{PENDING}', origin FROM unnest(CAST(:signal_ids AS varchar[]), "
    "CAST(:signal_kinds AS text[]), CAST(:signal_payloads AS text[]), CAST(:signal_emitted_at AS varchar[]), "
    "CAST(:signal_origins AS varchar[])) AS r(id, kind, payload, emitted_at, origin))",
    _carried_arrays,
)


async def insert_many(
    conn: AsyncConnection, pending: Sequence[tuple[str, str, Any, str]], *, origin: str = OPERATOR,
    wake: str | None = None, late: bool = False,
) -> None:
    """Record pending Signals, each ``(id, kind, payload, emitted_at)``, emitted by ``origin``, in
    order, with one statement; and wake the channel ``wake`` once the transaction commits.

    ``late`` (with ``wake``): on PostgreSQL the statement that sends the transaction's NOTIFY, its
    last, writes them (a round trip less), so the transaction itself never sees them: for an
    emitter that reads none of them back (the Signal Worker claims them once committed).
    """
    if late and wake is not None and pending and engine.carry(
        conn, _CARRIED, [(id, kind, jsontext.dumps(payload).decode(), at, origin) for id, kind, payload, at in pending],
        wake,
    ):
        return
    rows = [
        {
            "id": id, "kind": kind, "payload": payload, "emitted_at": emitted_at, "state": PENDING, "error": None,
            "origin": origin,
        }
        for id, kind, payload, emitted_at in pending
    ]
    await conn.execute(_INSERT, rows)
    if wake is not None:
        engine.notify(conn, wake)


async def get(conn: AsyncConnection, *, id: str) -> Signal | None:
    row = (await conn.execute(sa.select(*_COLUMNS).where(signals.c.id == id))).first()
    return Signal.from_row(row) if row else None


async def get_many(conn: AsyncConnection, *, ids: Sequence[str]) -> list[Signal]:
    """The Signals with these ids, in emission order."""
    query = sa.select(*_COLUMNS).where(signals.c.id.in_(ids)).order_by(*_QUEUE_ORDER)
    return [Signal.from_row(row) for row in await conn.execute(query)]


def _newest(*, limit: object, kind: object = None, state: object = None) -> sa.Select:
    query = sa.select(*_COLUMNS).order_by(*_NEWEST_FIRST).limit(limit)
    if kind is not None:
        query = query.where(signals.c.kind == kind)
    if state is not None:
        query = query.where(signals.c.state == state)
    return query


async def newest(
    conn: AsyncConnection, *, limit: int, kind: str | None = None, state: str | None = None
) -> list[Signal]:
    return [Signal.from_row(row) for row in await conn.execute(_newest(limit=limit, kind=kind, state=state))]


# The Agent server's GET /signals, which agents poll: one statement straight on the driver (see
# store.direct), outside any transaction; of any kind, then of one.
_RECENT = tuple(
    direct.Query(_newest(limit=sa.bindparam("limit", type_=sa.Integer), kind=of_kind))
    for of_kind in (None, sa.bindparam("kind"))
)


async def recent(store: Store, *, limit: int, kind: str | None = None) -> list[Signal]:
    """:func:`newest` without a state, read outside any transaction."""
    of_kind = {} if kind is None else {"kind": kind}
    return [Signal.from_driver(row) for row in await store.fetch(_RECENT[bool(of_kind)], limit=limit, **of_kind)]


async def count_by_state(conn: AsyncConnection) -> dict[str, int]:
    """How many Signals are in each state, every state named."""
    query = sa.select(signals.c.state, sa.func.count()).group_by(signals.c.state)
    counted = dict((await conn.execute(query)).all())
    return {state: counted.get(state, 0) for state in STATES}


async def claim_oldest(conn: AsyncConnection) -> Signal | None:
    """Move the oldest pending Signal to ``processing`` and return it; None when none is pending."""
    rows = await direct.run(conn, _CLAIM[conn.dialect.name])
    return Signal.from_driver(rows[0]) if rows else None


async def finish(conn: AsyncConnection, *, id: str, error: str | None) -> bool:
    """End a ``processing`` Signal: ``done`` without an error, ``failed`` with one."""
    return len(await direct.run(conn, _FINISH, **_finish_params(id, error))) == 1


def _finish_params(id: str, error: str | None) -> dict[str, str | None]:
    return {"signal_id": id, "signal_state": DONE if error is None else FAILED, "signal_error": error}


async def end_and_claim(
    conn: AsyncConnection, *, run_id: str, run_error: str | None, ended_at: str, signal_id: str,
    signal_error: str | None, signal_error_if_cancelled: str,
) -> Signal | None:
    """End a ``running`` Run and its ``processing`` Signal (each ``done`` without an error,
    ``failed`` with one), then claim the oldest pending Signal, as ``runs.finish``, :func:`finish`
    and :func:`claim_oldest` in this order would; one statement on PostgreSQL. When the Run
    is no longer running (an operator cancelled it), the Signal fails with
    ``signal_error_if_cancelled`` instead."""
    if conn.dialect.name != "postgresql":  # SQLite's statements cost no round trip
        if not await run_queries.finish(conn, id=run_id, error=run_error, ended_at=ended_at):
            signal_error = signal_error_if_cancelled
        await finish(conn, id=signal_id, error=signal_error)
        return await claim_oldest(conn)
    params = ending(
        run_id=run_id, run_error=run_error, ended_at=ended_at, signal_id=signal_id, signal_error=signal_error,
        signal_error_if_cancelled=signal_error_if_cancelled,
    )
    rows = await direct.run(conn, _END_AND_CLAIM, **params)
    return Signal.from_driver(rows[0]) if rows else None


def ending(
    *, run_id: str, run_error: str | None, ended_at: str, signal_id: str, signal_error: str | None,
    signal_error_if_cancelled: str,
) -> dict[str, str | None]:
    """The parameters of :func:`ended` (see :func:`end_and_claim`)."""
    params = run_queries.finish_params(id=run_id, error=run_error, ended_at=ended_at) | _finish_params(signal_id, signal_error)
    params["signal_error_if_cancelled"] = signal_error_if_cancelled
    return params


async def end(conn: direct.Alone, params: Mapping[str, object]) -> Queued | None:
    """:func:`end_and_claim`'s ends (``params`` from :func:`ending`) without the claim, as one
    PostgreSQL statement that commits alone; the oldest pending Signal as it saw it."""
    rows = await direct.run(conn, _END, **params)
    return _queued(rows[0]) if rows else None


async def fail_processing(conn: AsyncConnection, *, error: str) -> list[str]:
    """Fail every ``processing`` Signal (left by a stopped process); return their ids."""
    query = (
        signals.update()
        .where(signals.c.state == PROCESSING)
        .values(state=FAILED, error=error)
        .returning(signals.c.id)
    )
    return list((await conn.execute(query)).scalars())


async def cancel(conn: AsyncConnection, *, id: str, error: str) -> Signal | None:
    """Fail a ``pending`` Signal with ``error``; None when it is in another state or does not exist."""
    query = (
        signals.update()
        .where(signals.c.id == id, signals.c.state == PENDING)
        .values(state=FAILED, error=error)
        .returning(*_COLUMNS)
    )
    row = (await conn.execute(query)).first()
    return Signal.from_row(row) if row else None


async def count_failed_with(conn: AsyncConnection, *, error: str) -> int:
    """How many Signals are ``failed`` with exactly ``error``."""
    query = sa.select(sa.func.count()).where(signals.c.state == FAILED, signals.c.error == error)
    return (await conn.execute(query)).scalar_one()


# A Message's Signal: emitted in the transaction that recorded the Message, so at or after its
# createdAt and before ``until`` (the index on kind and emittedAt finds it a few rows in), its
# payload the Message record, whose "id" member the pattern matches (a quote inside a JSON string
# is escaped, so the text cannot forge it; the caller checks the payload again).
_CARRYING = direct.Query(
    sa.select(*_COLUMNS)
    .where(
        signals.c.kind == sa.bindparam("kind"),
        signals.c.emitted_at >= sa.bindparam("since"),
        signals.c.emitted_at <= sa.bindparam("until"),
        signals.c.payload.like(sa.bindparam("pattern", type_=sa.Text)),
    )
    .order_by(*_QUEUE_ORDER)
    .limit(1)
)


async def carrying(store: Store, *, kind: str, since: str, until: str, payload_id: str) -> Signal | None:
    """The first Signal of ``kind`` emitted from ``since`` to ``until`` whose payload's ``id`` is
    ``payload_id`` (a UUID), if any."""
    rows = await store.fetch(_CARRYING, kind=kind, since=since, until=until, pattern=f'%"id":"{payload_id}"%')
    return Signal.from_driver(rows[0]) if rows else None
