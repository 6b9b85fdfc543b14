"""Queries on Message logs: one numbered log per User, both directions in one sequence."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Mapping, Sequence

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import errors, records
from agent_gateway.store import direct, engine, notifications
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.tables import messages, users

# The (user_id, seq) primary key: a collision on it is a lost numbering race.
_PRIMARY_KEY = "pk_messages"


class LostRace(errors.Busy):
    """Not recorded: another write to this User's Message log took the same number; resending is correct."""


@dataclasses.dataclass(frozen=True)
class Message:
    id: str
    user_id: str
    direction: str
    seq: int
    text: str
    created_at: str

    def to_json(self) -> records.Message:
        return {
            "id": self.id,
            "userId": self.user_id,
            "direction": self.direction,
            "seq": self.seq,
            "text": self.text,
            "createdAt": self.created_at,
        }


_COLUMNS = (
    messages.c.id,
    messages.c.user_id,
    messages.c.direction,
    messages.c.seq,
    messages.c.text,
    messages.c.created_at,
)


# The writes run straight on the driver (see store.direct): they are every Message's path.
# One statement numbers and writes a Message: seq is one past the User's largest,
# and selecting from users makes a User nobody holds insert nothing.
_APPEND = direct.Query(
    messages.insert()
    .from_select(
        [column.name for column in _COLUMNS],
        sa.select(
            sa.bindparam("id", type_=messages.c.id.type),
            users.c.id,
            sa.bindparam("direction", type_=messages.c.direction.type),
            sa.select(sa.func.coalesce(sa.func.max(messages.c.seq), 0) + 1)
            .where(messages.c.user_id == users.c.id)
            .scalar_subquery(),
            sa.bindparam("text", type_=messages.c.text.type),
            sa.bindparam("created_at", type_=messages.c.created_at.type),
        ).where(users.c.id == sa.bindparam("user_id", type_=users.c.id.type)),
    )
    .returning(messages.c.seq)
)
# Rows are locked in the order they are returned: always the same order, so two
# writers locking overlapping sets of Users cannot deadlock.
_LOCK_USERS = direct.Query(
    sa.select(users.c.id)
    .where(users.c.id == sa.func.any(sa.bindparam("user_ids", type_=postgresql.ARRAY(sa.Text))))
    .order_by(users.c.id)
    .with_for_update()
)


async def lock_logs(conn: AsyncConnection, *, user_ids: Sequence[str]) -> None:
    """Make the other writers of these Users' logs wait until this transaction ends.

    On PostgreSQL this locks the Users' rows. Their message inserts take a
    key share lock on the same rows (the foreign key), so they queue behind
    it too. On SQLite the writing transaction (``BEGIN IMMEDIATE``) already
    holds the database's one write lock, so there is nothing more to take.
    """
    if conn.dialect.name == "postgresql":
        await direct.run(conn, _LOCK_USERS, user_ids=list(user_ids))


async def append(
    conn: AsyncConnection, *, id: str, user_id: str, direction: str, text: str, created_at: str
) -> Message | None:
    """Append a Message to ``user_id``'s log, numbered one past its largest ``seq``.

    Returns None, having written nothing, when no User has ``user_id``. The
    number is computed inside the INSERT. Writers of one User that did not
    :func:`lock_logs` can still compute the same number; the primary key
    refuses the second, which raises :class:`LostRace` (its transaction is then
    unusable and must roll back, leaving nothing stored).
    """
    try:
        rows = await direct.run(
            conn, _APPEND, id=id, user_id=user_id, direction=direction, text=text, created_at=created_at
        )
    except _UNIQUE_VIOLATIONS as exc:
        if _is_lost_race(exc):
            raise LostRace() from exc
        raise
    return Message(id, user_id, direction, rows[0][0], text, created_at) if rows else None


# On PostgreSQL one statement numbers a whole batch: each row is one past its User's
# largest seq as the statement found it, plus its place among that User's rows here.
_ARRAYS = ("ids", "user_ids", "directions", "texts", "created_ats")


def _append_many_postgres(users: str) -> str:
    """The batch's INSERT, its Users read from ``users`` (the table, or the rows a statement locked)."""
    return (
        "INSERT INTO messages (id, user_id, direction, seq, text, created_at) "
        "SELECT d.id, u.id, d.direction, "
        "coalesce((SELECT max(m.seq) FROM messages AS m WHERE m.user_id = u.id), 0) "
        "+ row_number() OVER (PARTITION BY u.id ORDER BY d.n), d.text, d.created_at "
        "FROM unnest(:ids, :user_ids, :directions, :texts, :created_ats) "
        "WITH ORDINALITY AS d(id, user_id, direction, text, created_at, n) "
        f"JOIN {users} AS u ON u.id = d.user_id "
        "RETURNING id, seq, user_id"
    )


def _append_one_postgres(users: str) -> str:
    """:func:`_append_many_postgres` for a batch of one row, the same arrays' first elements: no
    unnest, join, sort or window for PostgreSQL to start at each execution. A batch of one is the
    usual write (a Run's answer, a User's Message when nobody else writes at once); its server
    CPU was 0.20 ms against 0.28 in the batch's form (one-row INSERTs of 300 Users, alternating)."""
    return (
        "INSERT INTO messages (id, user_id, direction, seq, text, created_at) "
        "SELECT (:ids)[1], u.id, (:directions)[1], "
        "coalesce((SELECT max(m.seq) FROM messages AS m WHERE m.user_id = u.id), 0) + 1, (:texts)[1], (:created_ats)[1] "
        f"FROM {users} AS u WHERE u.id = (:user_ids)[1] "
        "RETURNING id, seq, user_id"
    )


# The streams of the Users written to are woken by the statement that writes their Messages, not
# by a NOTIFY statement of their own before COMMIT (a round trip less): each statement around
# the batch's INSERT joins its rows with this, so PostgreSQL sends the notifications (at commit,
# as every NOTIFY) whenever it writes a Message.
WOKEN = f"woken AS (SELECT {notifications.PG_NOTIFY})"


# A statement written alone first locks the Users it writes to (lock_logs, in the statement), so
# that it waits for their other writers before it writes anything. Its rows are locked as the sort
# hands them on: in the order of their ids, as lock_logs locks them.
_LOCKED = "locked AS MATERIALIZED (SELECT id FROM users WHERE id = ANY(:user_ids) ORDER BY id FOR UPDATE), "
_LOCKED_ONE = "locked AS MATERIALIZED (SELECT id FROM users WHERE id = (:user_ids)[1] FOR UPDATE), "


@dataclasses.dataclass(frozen=True)
class Appending:
    """A statement around a batch's INSERT (:func:`appending_many`), in two forms taking the same
    parameters: for a batch of one row, and for more."""

    one: direct.Query
    many: direct.Query

    def of(self, rows: Sequence[object]) -> direct.Query:
        """The form that writes ``rows``."""
        return self.one if len(rows) == 1 else self.many


def appending_many(select: str, *, locking: bool = False, also: str = "") -> Appending:
    """A statement around the batch's INSERT (:func:`_append_many_postgres`, or
    :func:`_append_one_postgres` for one row) and :data:`WOKEN`: ``select`` reads the written rows
    as ``appended AS a`` (each Message's id and seq first) joined with ``woken``; its array
    parameters typed. ``locking``: the rows are written from the Users it locks first. ``also``:
    more WITH clauses, which may read ``appended``."""
    users = "locked" if locking else "users"

    def form(locked: str, insert: str) -> direct.Query:
        sql = f"WITH {locked if locking else ''}appended AS ({insert}), {WOKEN}{also} {select}"
        return direct.Query(sa.text(sql).bindparams(*(sa.bindparam(name, type_=postgresql.ARRAY(sa.Text)) for name in _ARRAYS)))

    return Appending(form(_LOCKED_ONE, _append_one_postgres(users)), form(_LOCKED, _append_many_postgres(users)))


_WRITTEN = "SELECT a.id, a.seq, a.user_id FROM appended AS a CROSS JOIN woken"
_APPEND_MANY_POSTGRES = appending_many(_WRITTEN)
_APPEND_ALONE = appending_many(_WRITTEN, locking=True)
# The inbound Messages' pending Signals, written by the same statement: each payload is the
# Message's record as the gateway writes it (jsontext), the number the statement gave the Message
# put between the record's text before its seq and after it, so it is the text a Signal emitted
# in a transaction would hold, byte for byte.
_APPEND_RECEIVED_ALONE = appending_many(
    _WRITTEN,
    locking=True,
    also=(
        ", new_signals AS (INSERT INTO signals (id, kind, payload, emitted_at, state, origin) "
        f"SELECT s.id, :signal_kind, s.before_seq || a.seq || s.after_seq, s.emitted_at, '{signal_queries.PENDING}', :signal_origin "
        "FROM unnest(CAST(:signal_ids AS varchar[]), CAST(:signal_messages AS varchar[]), "
        "CAST(:signal_before_seq AS text[]), CAST(:signal_after_seq AS text[]), CAST(:signal_emitted_at AS varchar[])) "
        "WITH ORDINALITY AS s(id, message, before_seq, after_seq, emitted_at, n) "
        "JOIN appended AS a ON a.id = s.message ORDER BY s.n)"
    ),
)


@dataclasses.dataclass(frozen=True)
class Received:
    """The pending Signals of a statement's inbound Messages (:func:`append_alone`): for each
    Message (by its id) the Signal's id, its payload's text around the Message's seq, and when."""

    kind: str
    origin: str
    signals: Sequence[tuple[str, str, str, str, str]]  # (id, message id, before seq, after seq, emitted at)

    def params(self) -> dict[str, object]:
        columns = list(zip(*self.signals, strict=True))
        return {
            "signal_kind": self.kind, "signal_origin": self.origin,
            **{
                name: list(values) for name, values in zip(
                    ("signal_ids", "signal_messages", "signal_before_seq", "signal_after_seq", "signal_emitted_at"),
                    columns, strict=True,
                )
            },
        }


async def append_alone(
    conn: AsyncConnection, rows: Sequence[tuple[str, str, str, str, str]], payloads: Sequence[str],
    received: Received | None = None,
) -> list[Message | None]:
    """:func:`append_many` of ``rows`` on PostgreSQL as one statement that commits alone
    (``Store.alone``), its Users' locks (:func:`lock_logs`, in the same order) taken in it before
    it writes. Its snapshot is taken as it starts, so a writer that held a lock meanwhile may have
    committed the number it finds free: it then raises :class:`LostRace` having written nothing,
    and is simply run again. ``received``: the inbound Messages' Signals, written by the statement too."""
    if received is None or not received.signals:
        return (await append_many_postgres(conn, _APPEND_ALONE, rows, payloads))[0]
    return (await append_many_postgres(conn, _APPEND_RECEIVED_ALONE, rows, payloads, received.params()))[0]


async def append_many(
    conn: AsyncConnection, rows: Sequence[tuple[str, str, str, str, str]], wake: Callable[[str], str]
) -> list[Message | None]:
    """:func:`append` for each of ``rows`` (``id, user_id, direction, text, created_at``), in order.

    Returns, in their places, the Messages and None for rows of a User nobody
    holds. A User's rows are numbered in the order given. SQLite appends them
    one statement each (statements cost it no round trip); PostgreSQL with one.
    The channel ``wake(user_id)`` of each User written to is woken once the transaction commits.
    """
    if conn.dialect.name != "postgresql":
        appended = []
        for id, user_id, direction, text, created_at in rows:
            appended.append(
                await append(conn, id=id, user_id=user_id, direction=direction, text=text, created_at=created_at)
            )
        for user_id in sorted({message.user_id for message in appended if message is not None}):
            engine.notify(conn, wake(user_id))
        return appended
    return (await append_many_postgres(conn, _APPEND_MANY_POSTGRES, rows, wakes(conn, rows, wake)))[0]


def wakes(conn: AsyncConnection, rows: Sequence[tuple[str, str, str, str, str]], wake: Callable[[str], str]) -> list[str]:
    """The NOTIFY payloads that wake the channels ``wake(user_id)`` of the Users of ``rows`` in
    every process once ``conn``'s transaction commits (this process's at its commit). Every User
    drafted: the statement sends nothing unless it writes a Message, and a wake-up of a User nobody
    holds reaches nobody."""
    woken = [engine.notify_in_statement(conn, wake(user_id)) for user_id in sorted({row[1] for row in rows})]
    return [payload for payload in woken if payload is not None]


async def append_many_postgres(
    conn: AsyncConnection, query: Appending, rows: Sequence[tuple[str, str, str, str, str]], payloads: Sequence[str],
    params: Mapping[str, object] | None = None,
) -> tuple[list[Message | None], Sequence[Sequence[object]]]:
    """:func:`append_many` on PostgreSQL with ``query`` (see :func:`appending_many`) and its other
    ``params``, sending the NOTIFY ``payloads``; also the rows it returned, for what it read beside the Messages."""
    if not rows:
        return [], []
    columns = {name: list(values) for name, values in zip(_ARRAYS, zip(*rows), strict=True)}
    try:
        returned = await direct.run(
            conn, query.of(rows), channel=notifications.PG_CHANNEL, payloads=list(payloads), **columns, **(params or {})
        )
    except _UNIQUE_VIOLATIONS as exc:
        if _is_lost_race(exc):
            raise LostRace() from exc
        raise
    numbered = {row[0]: row[1] for row in returned}
    appended = [
        Message(id, user_id, direction, numbered[id], text, created_at) if id in numbered else None
        for id, user_id, direction, text, created_at in rows
    ]
    return appended, returned


# What each driver raises for a duplicate key.
_UNIQUE_VIOLATIONS = (sqlite3.IntegrityError, asyncpg.UniqueViolationError)


def _is_lost_race(exc: sqlite3.IntegrityError | asyncpg.UniqueViolationError) -> bool:
    """Whether the driver's error is a collision on the (user_id, seq) primary key."""
    if getattr(exc, "sqlite_errorname", None) == "SQLITE_CONSTRAINT_PRIMARYKEY":
        return True
    return getattr(exc, "constraint_name", None) == _PRIMARY_KEY


_WINDOWS = windows.Queries(sa.select(*_COLUMNS).where(messages.c.user_id == sa.bindparam("user_id")), messages.c.seq)


async def window(store: Store, *, user_id: str, window: windows.Window) -> list[Message]:
    """One cursor window of ``user_id``'s log, ascending by ``seq``."""
    return [Message(*row) for row in await _WINDOWS.rows(store, window, user_id=user_id)]


# SQLite's rowid of the table: the HTTP workers' poll of every log (streams.hub) reads the
# end of one B-tree, a page read. Rows are never deleted, so the rowid only grows.
_ROWID = sa.literal_column("rowid")
_LAST_ROWID = direct.Query(sa.select(sa.func.coalesce(sa.func.max(_ROWID), 0)).select_from(messages))
_WRITERS_SINCE = direct.Query(
    sa.select(messages.c.user_id).distinct().where(_ROWID > sa.bindparam("rowid", type_=sa.Integer))
)


async def last_rowid(store: Store) -> int:
    """The largest rowid of the Message table on SQLite, 0 when it is empty."""
    [(newest,)] = await store.fetch(_LAST_ROWID)
    return newest


async def writers_since(store: Store, *, rowid: int) -> list[str]:
    """The Users whose logs have a row past ``rowid`` (on SQLite)."""
    return [user_id for (user_id,) in await store.fetch(_WRITERS_SINCE, rowid=rowid)]


_GET = direct.Query(
    sa.select(*_COLUMNS).where(messages.c.user_id == sa.bindparam("user_id"), messages.c.seq == sa.bindparam("seq"))
)


async def get(store: Store, *, user_id: str, seq: int) -> Message | None:
    """Message ``seq`` of ``user_id``'s log, either direction."""
    rows = await store.fetch(_GET, user_id=user_id, seq=seq)
    return Message(*rows[0]) if rows else None
