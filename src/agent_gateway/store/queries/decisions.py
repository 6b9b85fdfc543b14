"""Queries on the Decision log."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import jsontext, records
from agent_gateway.store import direct, engine, notifications
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import tree, webhooks
from agent_gateway.store.tables import decisions

# The sequence PostgreSQL creates for the serial column decisions.seq.
POSTGRES_SEQUENCE = "decisions_seq_seq"
# Woken once Decisions are published, when a loop watches them (engine.watched).
CHANNEL = "decisions"
# Any constant shared by every publisher: the key of the advisory lock that orders them.
_PUBLISH_LOCK_KEY = 0x4465_6369  # "Deci"


@dataclasses.dataclass(frozen=True)
class Decision:
    seq: int
    statement: str
    jws: str
    created_at: str

    def to_json(self) -> records.Decision:
        return _record(self.seq, self.statement, self.jws, self.created_at)


def _record(seq: int, statement: str | orjson.Fragment, jws: str, created_at: str) -> records.Decision:
    """A Decision's JSON record; ``statement`` parsed, or as its stored JSON text (:func:`window_records`)."""
    return {"seq": seq, "statement": statement, "jws": jws, "createdAt": created_at}  # type: ignore[typeddict-item]


_COLUMNS = (decisions.c.seq, decisions.c.statement, decisions.c.jws, decisions.c.created_at)
_SQLITE_NEXT = direct.Query(
    sa.text("SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'decisions'), 0) + 1")
)
# The lock is taken (again, which a transaction may) before each number is drawn.
_POSTGRES_NEXT = direct.Query(
    sa.text(
        f"SELECT pg_advisory_xact_lock({_PUBLISH_LOCK_KEY}), nextval('{POSTGRES_SEQUENCE}') "
        "FROM generate_series(1, :count)"
    )
)


async def draw_numbers(conn: AsyncConnection, count: int) -> list[int]:
    """The next ``count`` numbers of the log, ascending, reserved for the caller's writing transaction.

    Numbers must be committed in the order they are drawn, or a reader
    walking forwards with ``after`` could pass a number whose Decision
    commits later and never see it. So publishers are serialized until
    commit: on SQLite by the write lock every writing transaction already
    takes (BEGIN IMMEDIATE), which makes reading the AUTOINCREMENT counter
    safe; on PostgreSQL by a transaction-scoped advisory lock taken before
    ``nextval``. A rolled-back publish may burn PostgreSQL numbers.
    """
    if conn.dialect.name == "postgresql":
        return sorted(number for _, number in await direct.run(conn, _POSTGRES_NEXT, count=count))
    [(first,)] = await direct.run(conn, _SQLITE_NEXT)
    return list(range(first, first + count))

# A writer alone takes the lock for its session (see Lease), once for a run of batches.
_POSTGRES_LOCK_AND_NEXT = direct.Query(
    sa.text(
        f"WITH locked AS MATERIALIZED (SELECT pg_advisory_lock({_PUBLISH_LOCK_KEY})) "
        f"SELECT nextval('{POSTGRES_SEQUENCE}') FROM locked, generate_series(1, :count)"
    )
)
_POSTGRES_UNLOCK = direct.Query(sa.text(f"SELECT pg_advisory_unlock({_PUBLISH_LOCK_KEY})"))
# Batches in a row under one Lease before it lets the other publishers (processes) have a turn,
# and how long it waits for the next batch before letting the lock go.
LEASE_BATCHES = 16
LEASE_LINGER_S = 0.005


class Lease:
    """The numbers of one publisher writing alone on PostgreSQL, each batch one statement that
    commits by itself (``direct.Alone``), without BEGIN and COMMIT.

    The lock that orders publishers (:func:`draw_numbers`) is then taken for the session, with the
    first batch's numbers, and held while batches follow one another on a connection that lasts
    (``direct.Alone.own``), up to :data:`LEASE_BATCHES` in a row: as no other publisher can draw
    meanwhile, the next batch's numbers follow this one's, and are written without a statement to
    draw them (:func:`insert` sets the sequence to the last, for the next publisher to go on from).
    Under load a batch is one round trip instead of four (BEGIN, the draw, the write, COMMIT).
    Released once no batch has come for a moment (:meth:`release`); a batch that
    fails drops its connection, whose session the server ends, releasing the lock whatever the
    session's state (a run of batches is never left holding it)."""

    def __init__(self) -> None:
        # The connection holding the lock, and the number after the last it wrote.
        self._holder: object | None = None
        self._next = 0
        self._batches = 0

    async def draw(self, conn: direct.Alone, count: int) -> list[int]:
        """:func:`draw_numbers` for a batch written alone on ``conn``."""
        if self._holder is conn.driver:
            return list(range(self._next, self._next + count))
        self._holder, self._batches = conn.driver, 0
        return sorted(number for (number,) in await direct.run(conn, _POSTGRES_LOCK_AND_NEXT, count=count))

    async def written(self, conn: direct.Alone, last: int) -> None:
        """After a batch's statement committed, ``last`` its last number: hold the lock for the
        next batch (on a connection that lasts, up to :data:`LEASE_BATCHES`), else release it."""
        self._next, self._batches = last + 1, self._batches + 1
        if not conn.own or self._batches >= LEASE_BATCHES:
            await self.release(conn)

    async def release(self, conn: direct.Alone) -> None:
        """Let the lock go if ``conn`` holds it: when no batch has come for :data:`LEASE_LINGER_S`
        (``store.batch.Batcher``'s ``idle``), so no other publisher waits for one that is idle."""
        holder, self._holder = self._holder, None
        if holder is not conn.driver:  # its session ended, with the lock
            return
        try:
            await direct.run(conn, _POSTGRES_UNLOCK)
        except Exception:  # the batch committed: its callers have their Decisions; the session goes
            conn.driver.terminate()

    def failed(self, conn: direct.Alone) -> None:
        """A batch on ``conn`` failed, holding the lock or drawing it: end the session, with the lock."""
        self._holder = None
        conn.driver.terminate()


# The Statement goes in as its JSON text (see direct.run).
_INSERT = direct.Query(
    decisions.insert().values(
        seq=sa.bindparam("number"),
        statement=sa.bindparam("statement_json", type_=sa.Text),
        jws=sa.bindparam("signed"),
        created_at=sa.bindparam("at"),
        leaf_index=sa.bindparam("leaf"),
    )
)


# On PostgreSQL the Decisions and the tree's new nodes go in with one statement (one round
# trip), and so do their webhook deliveries when there are any, with the NOTIFY that wakes
# the deliverers and the loop watching the log (one payload each).
_POSTGRES_WITH = (
    "nodes AS (INSERT INTO decision_tree (node, hash) "
    "SELECT * FROM unnest(CAST(:keys AS bigint[]), CAST(:hashes AS bytea[])))"
)
_POSTGRES_DECISIONS = (
    "INSERT INTO decisions (seq, statement, jws, created_at, leaf_index) "
    "SELECT * FROM unnest(CAST(:numbers AS bigint[]), CAST(:statements AS text[]), CAST(:signed AS text[]), "
    "CAST(:ats AS varchar[]), CAST(:leaves AS bigint[]))"
)
# Its result sets the sequence to the batch's last number, which a Lease's batches drew none of
# (in a transaction, the number nextval gave it: no change).
_POSTGRES_LAST = (
    f"SELECT setval('{POSTGRES_SEQUENCE}', CAST(:last AS bigint)) FROM (SELECT {notifications.PG_NOTIFY}) AS notified"
)
_POSTGRES_INSERT = direct.Query(sa.text(f"WITH {_POSTGRES_WITH}, decided AS ({_POSTGRES_DECISIONS}) {_POSTGRES_LAST}"))
_POSTGRES_INSERT_DELIVERING = direct.Query(sa.text(
    f"WITH {_POSTGRES_WITH}, decided AS ({_POSTGRES_DECISIONS}), {webhooks.NEW_ROWS.with_clause} {_POSTGRES_LAST}"
))


async def insert(
    conn: AsyncConnection | direct.Alone, published: Sequence[Decision], growth: tree.Growth,
    deliveries: Sequence[tuple[Any, ...]] = (), *, channel: str = "",
) -> None:
    """Write ``published`` Decisions, numbered by :func:`draw_numbers` in this transaction (or by a
    :class:`Lease`, in this statement alone, on ``engine.committing``'s ``conn``), the
    tree's nodes they complete (``growth``, see ``store.queries.tree``) and the webhook ``deliveries``
    that report them (as ``store.queries.webhooks.insert`` takes them, waking ``channel``), and
    wake :data:`CHANNEL` when a loop watches the log."""
    watched = engine.watched(conn, CHANNEL)
    statements = [jsontext.dumps(d.statement).decode() for d in published]
    leaves = range(growth.first_leaf, growth.first_leaf + len(published))
    if conn.dialect.name == "postgresql":
        woken = ([channel] if deliveries else []) + ([CHANNEL] if watched else [])
        columns = {
            "keys": [key for key, _ in growth.nodes],
            "hashes": [hash_ for _, hash_ in growth.nodes],
            "numbers": [d.seq for d in published],
            "statements": statements,
            "signed": [d.jws for d in published],
            "ats": [d.created_at for d in published],
            "leaves": list(leaves),
            "last": published[-1].seq,
            "channel": notifications.PG_CHANNEL,
            "payloads": [payload for name in woken if (payload := engine.notify_in_statement(conn, name)) is not None],
        }
        if deliveries:
            await direct.run(conn, _POSTGRES_INSERT_DELIVERING, **columns, **webhooks.NEW_ROWS.arrays(deliveries))
        else:
            await direct.run(conn, _POSTGRES_INSERT, **columns)
        return
    rows = [
        {"number": d.seq, "statement_json": text, "signed": d.jws, "at": d.created_at, "leaf": leaf}
        for d, text, leaf in zip(published, statements, leaves, strict=True)
    ]
    await direct.run_many(conn, _INSERT, rows)
    await tree.DECISIONS.write(conn, growth)
    if deliveries:
        await webhooks.insert(conn, deliveries, channel=channel)
    if watched:
        engine.notify(conn, CHANNEL)


_GET = direct.Query(sa.select(*_COLUMNS).where(decisions.c.seq == sa.bindparam("seq")))
_WINDOWS = windows.Queries(sa.select(*_COLUMNS), decisions.c.seq)


async def get(store: Store, *, seq: int) -> Decision | None:
    rows = await store.fetch(_GET, seq=seq)
    return _decision(rows[0]) if rows else None


async def get_many(conn: AsyncConnection, *, seqs: Sequence[int]) -> list[Decision]:
    """The Decisions with these numbers, ascending, in ``conn``'s transaction."""
    query = sa.select(*_COLUMNS).where(decisions.c.seq.in_(seqs)).order_by(decisions.c.seq)
    # Through SQLAlchemy, whose column type decodes the Statement (_decision is for the driver's rows).
    return [Decision(*row) for row in await conn.execute(query)]


async def window(store: Store, *, window: windows.Window) -> list[Decision]:
    """The Decisions of a cursor window, ascending by number."""
    return [_decision(row) for row in await _WINDOWS.rows(store, window)]


async def window_records(store: Store, *, window: windows.Window) -> list[records.Decision]:
    """:func:`window` as a page answers it: each Decision's record, its Statement embedded as the
    JSON text stored (``tables.JSONText``, written by ``jsontext.dumps``: byte for byte what
    encoding the parsed Statement gives). No parse and no object per Decision: a page of 50 took
    85 µs from rows to JSON through :class:`Decision`, 12–15 µs so, a quarter of a page's request."""
    return [
        _record(seq, orjson.Fragment(statement), jws, created_at)
        for seq, statement, jws, created_at in await _WINDOWS.rows(store, window)
    ]


def _decision(row: Sequence[Any]) -> Decision:
    seq, statement, jws, created_at = row
    return Decision(seq, jsontext.loads(statement), jws, created_at)
