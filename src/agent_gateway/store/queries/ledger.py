"""Queries on the Run ledger (issue 41): its entries and its Merkle tree (``store.queries.tree``).

Entries are numbered from 1 without gaps; entry ``seq`` is leaf ``seq - 1`` of the ledger's
tree, its data the entry's ``leaf`` bytes. They are written as Decisions are (the Decision log's
``draw_numbers``), under a lock that orders every writer until commit: on SQLite the write lock
every writing transaction takes (BEGIN IMMEDIATE), on PostgreSQL a transaction-scoped advisory
lock of the ledger's own, taken with a draw of a sequence in one statement. An entry's number is
its leaf's index + 1: a rolled-back write leaves no entry and no gap, and entries are committed in
number order in every process. The tree is grown after them (``tree.Tree.integrate``): a Run's
start writes its entry alone, and the tree catches up with the committed entries in batches.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import direct, engine
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries import tree
from agent_gateway.store.tables import INSTRUCTIONS_ONLY, ledger_entries, runs

INSTRUCTIONS, RUN = "instructions", "run"
# Any constant shared by every writer of the ledger: the key of the advisory lock that orders them.
_APPEND_LOCK_KEY = 0x4C65_6467  # "Ledg"

# Woken once entries are appended, when a loop watches the ledger (engine.watched).
CHANNEL = "ledger"

TREE = tree.Tree(
    "ledger_tree",
    "SELECT CAST(seq - 1 AS BIGINT) FROM ledger_entries WHERE seq = :number",
    tree.Entries(
        count="SELECT coalesce(max(seq), 0) FROM ledger_entries",
        data="SELECT leaf FROM ledger_entries WHERE seq > CAST(:start AS BIGINT) ORDER BY seq LIMIT :limit",
    ),
)

# The sequence that tells a writer whether another one appended since its last append (:class:`_Next`):
# drawn with the lock in one statement, as Decisions' numbers are; a rolled-back write burns a draw,
# which only makes the next append read the newest number.
POSTGRES_SEQUENCE = "ledger_draws"
_POSTGRES_DRAW = direct.Query(
    sa.text(
        f"SELECT pg_advisory_xact_lock({_APPEND_LOCK_KEY}), nextval('{POSTGRES_SEQUENCE}') "
        "FROM generate_series(1, :count)"
    )
)
_POSTGRES_LOCK = direct.Query(sa.text(f"SELECT pg_advisory_xact_lock({_APPEND_LOCK_KEY})"))
# Under the lock (taken by a draw before): the number the next entry takes.
_POSTGRES_NEXT = direct.Query(sa.text("SELECT coalesce(max(seq), 0) + 1 FROM ledger_entries"))
_POSTGRES_ENTRIES = (
    "INSERT INTO ledger_entries (seq, kind, leaf) "
    "SELECT * FROM unnest(CAST(:seqs AS bigint[]), CAST(:kinds AS varchar[]), CAST(:leaves AS text[]))"
)
_POSTGRES_INSERT = direct.Query(sa.text(_POSTGRES_ENTRIES))
# The same, writing the Runs whose entries these are as well (each naming its entry).
_POSTGRES_RECORD_INSERT = direct.Query(sa.text(f"WITH recorded AS ({run_queries.POSTGRES_INSERT}) {_POSTGRES_ENTRIES}"))
# And usually with their draw too (a round trip less on every Run's start): the entries numbered
# as this process expects them (:class:`_Next`) are written only if the first number drawn is
# :expected, that is if no other entry was appended since this process's last; the drawn
# numbers are answered either way, and on a miss the caller writes as above.
_DRAW_INSERT = (
    f"d AS MATERIALIZED (SELECT pg_advisory_xact_lock({_APPEND_LOCK_KEY}) AS locked, "
    f"nextval('{POSTGRES_SEQUENCE}') AS n FROM generate_series(1, :count)), "
    "hit AS (SELECT min(n) = CAST(:expected AS BIGINT) AS yes FROM d), "
    f"entries AS ({_POSTGRES_ENTRIES} WHERE (SELECT yes FROM hit))"
)
_POSTGRES_DRAW_INSERT = direct.Query(sa.text(f"WITH {_DRAW_INSERT} SELECT n FROM d"))
# The same, writing the Runs whose entries these are as well, on a hit (a Run's start: its Runs
# are recorded, naming the entry, and its entry appended in one round trip); on a miss the
# caller writes them with the entries, numbered as drawn.
_POSTGRES_RECORD_DRAW_INSERT = direct.Query(
    sa.text(
        f"WITH {_DRAW_INSERT}, recorded AS ({run_queries.POSTGRES_INSERT} WHERE (SELECT yes FROM hit)) SELECT n FROM d"
    )
)


def _claiming(ending: bool) -> direct.Query:
    """The Signal Worker's claim of a Signal it read ahead (``signals.claiming``), with its Runs
    recorded and the first's entry appended as :data:`_POSTGRES_RECORD_DRAW_INSERT` writes them,
    in one PostgreSQL statement that commits alone; the Run and Signal before it ended in it too
    when ``ending`` (``signals.ended``). One round trip where a transaction takes four. Nothing
    is claimed, recorded or appended unless the draw is the predicted one, so the ledger and the
    Runs never disagree; answers whether the Signal was claimed, and the Signal next
    (``signals.with_next``), then the number drawn."""
    draw = (
        sa.text(
            f"SELECT pg_advisory_xact_lock({_APPEND_LOCK_KEY}) AS locked, nextval('{POSTGRES_SEQUENCE}') AS n "
            "FROM generate_series(1, :count)"
        )
        .columns(sa.column("n", sa.BigInteger))
        .cte("d")
        .prefix_with("MATERIALIZED")
    )
    drawn = sa.select(sa.func.min(draw.c.n)).scalar_subquery()
    claimed = signal_queries.claiming(drawn == sa.bindparam("expected", type_=sa.BigInteger))
    written = [
        sa.text(f"{insert} WHERE EXISTS (SELECT FROM claimed)").columns().cte(name)
        for name, insert in (("recorded", run_queries.POSTGRES_INSERT), ("entries", _POSTGRES_ENTRIES))
    ]
    ends = signal_queries.ended() if ending else ()
    answer = signal_queries.with_next(claimed).add_columns(drawn.label("drawn"))
    return direct.Query(answer.add_cte(*ends, draw, claimed, *written))


_CLAIMING = {ending: _claiming(ending) for ending in (False, True)}
_COLUMNS = (ledger_entries.c.seq, ledger_entries.c.kind, ledger_entries.c.leaf)
_GET = direct.Query(sa.select(*_COLUMNS).where(ledger_entries.c.seq == sa.bindparam("number")))
_LAST_INSTRUCTIONS = direct.Query(
    sa.select(*_COLUMNS)
    .where(INSTRUCTIONS_ONLY)
    .order_by(ledger_entries.c.seq.desc())
    .limit(1)
)
_WINDOWS = windows.Queries(sa.select(*_COLUMNS), ledger_entries.c.seq)


# One entry numbered as this process predicts it (the usual Run start): written unless that number
# is taken, which it is exactly when another process appended since this one's last entry (the
# entries are numbered from 1 without gaps and never deleted, so the number is either the next
# or taken); then nothing is written, no row answered, and the entry is numbered as below. A plain
# insert where that one reads the newest number, numbers and sorts. One entry only: of several,
# OR IGNORE would skip the taken numbers and write the others.
_SQLITE_PREDICTED_INSERT = "INSERT OR IGNORE INTO ledger_entries (seq, kind, leaf) VALUES (?, ?, ?) RETURNING seq"


@functools.lru_cache(maxsize=16)
def _sqlite_insert(count: int) -> str:
    # On SQLite the write lock is held already: the entries are numbered on from the newest in
    # the statement that writes them (one statement where a read of the next number and an
    # executemany were two), and their numbers answered.
    values = ", ".join(f"({n}, ?, ?)" for n in range(count))
    return (
        "INSERT INTO ledger_entries (seq, kind, leaf) "
        "SELECT (SELECT coalesce(max(seq), 0) + 1 FROM ledger_entries) + v.column1, v.column2, v.column3 "
        f"FROM (VALUES {values}) AS v ORDER BY v.column1 RETURNING seq"
    )


@dataclasses.dataclass(frozen=True)
class _Next:
    """What this process's next append expects, unless another process appended since its last:
    the number it draws (PostgreSQL's sequence; 0 on SQLite) and the number its first entry takes."""

    draw: int
    seq: int


# Per engine (one per Store): set once an append of this process has committed.
_NEXT: weakref.WeakKeyDictionary[sa.Engine, _Next] = weakref.WeakKeyDictionary()


def _expect(conn: AsyncConnection, after: _Next) -> None:
    """Keep ``after`` for this process's next append once ``conn``'s transaction commits."""
    bound = conn.sync_engine
    engine.on_commit(conn, lambda: _NEXT.__setitem__(bound, after))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry: its number (its leaf's index + 1), its kind (``instructions`` or ``run``), and its leaf bytes."""

    seq: int
    kind: str
    leaf: bytes


@dataclasses.dataclass(frozen=True)
class New:
    """An entry to append: its kind, its leaf bytes, and the Run of a run entry (which names
    the entry's number: ``runs.entry_seq``)."""

    kind: str
    leaf: bytes
    run_id: str | None = None


async def append(conn: AsyncConnection, new: Sequence[New], record: Sequence[run_queries.Run] = ()) -> list[int]:
    """Append ``new`` entries in the caller's writing transaction (the tree grows after them:
    ``TREE.integrate``); their numbers. Holds the ledger's lock (PostgreSQL) until the transaction
    ends, and wakes :data:`CHANNEL` once it commits when a loop watches the ledger.

    ``record``: Runs to write too (``run_queries.to_record``), on PostgreSQL usually in the same
    statement. Each Run of a run entry names the entry: those of ``record`` as they are written,
    others (recorded before, started since) after."""
    if engine.watched(conn, CHANNEL):
        engine.notify(conn, CHANNEL)
    if conn.dialect.name == "postgresql":
        return await _append_postgres(conn, new, record)
    values = [value for entry in new for value in (entry.kind, entry.leaf.decode())]
    # This process's expected number is right when no other entry was appended since its last.
    expected = _NEXT.get(conn.sync_engine)
    rows: Sequence[Sequence[Any]] = ()
    if expected is not None and len(new) == 1:
        rows = await direct.run_sqlite(conn, _SQLITE_PREDICTED_INSERT, [expected.seq, *values])
    if not rows:
        rows = await direct.run_sqlite(conn, _sqlite_insert(len(new)), values)
    seqs = sorted(int(seq) for (seq,) in rows)
    numbered = _numbered(new, seqs)
    await run_queries.insert(conn, record, numbered)
    await _number_started(conn, numbered, record)
    _expect(conn, _Next(0, seqs[-1] + 1))
    return seqs


async def _append_postgres(conn: AsyncConnection, new: Sequence[New], record: Sequence[run_queries.Run]) -> list[int]:
    """:func:`append` on PostgreSQL: the draw, the entries and the Runs recorded in one statement
    when this process's expectation holds, else the draw, then the newest number read, then the write."""
    expected = _NEXT.get(conn.sync_engine)
    if expected is not None:
        seqs = list(range(expected.seq, expected.seq + len(new)))
        numbered = _numbered(new, seqs)
        query, runs = (
            (_POSTGRES_RECORD_DRAW_INSERT, run_queries.postgres_columns(record, numbered))
            if record else (_POSTGRES_DRAW_INSERT, {})
        )
        rows = await direct.run(conn, query, count=len(new), expected=expected.draw, seqs=seqs, **_columns(new), **runs)
        draws = sorted(number for (number,) in rows)
        if draws[0] == expected.draw:
            _expect(conn, _Next(draws[-1] + 1, seqs[-1] + 1))
            await _number_started(conn, numbered, record)
            return seqs
    else:
        draws = sorted(number for _, number in await direct.run(conn, _POSTGRES_DRAW, count=len(new)))
    # Under the lock the draw took, read by a statement after it: every entry appended before is seen.
    [(first,)] = await direct.run(conn, _POSTGRES_NEXT)
    seqs = list(range(first, first + len(new)))
    numbered = _numbered(new, seqs)
    query, runs = (
        (_POSTGRES_RECORD_INSERT, run_queries.postgres_columns(record, numbered)) if record else (_POSTGRES_INSERT, {})
    )
    await direct.run(conn, query, seqs=seqs, **_columns(new), **runs)
    await _number_started(conn, numbered, record)
    _expect(conn, _Next(draws[-1] + 1, seqs[-1] + 1))
    return seqs


def _numbered(new: Sequence[New], seqs: Sequence[int]) -> dict[str, int]:
    """The number of each run entry of ``new`` (numbered ``seqs``), by its Run's id."""
    return {entry.run_id: seq for entry, seq in zip(new, seqs, strict=True) if entry.run_id is not None}


async def _number_started(conn: AsyncConnection, numbered: Mapping[str, int], record: Sequence[run_queries.Run]) -> None:
    """Name the entries of Runs not in ``record``: recorded before, started in this transaction."""
    recorded = {run.id for run in record}
    started = {id: seq for id, seq in numbered.items() if id not in recorded}
    if started:
        await run_queries.number(conn, started)


async def claim_ahead(
    conn: direct.Alone, queued: signal_queries.Queued, new: New, record: Sequence[run_queries.Run],
    ending: Mapping[str, object] | None = None,
) -> tuple[bool, signal_queries.Queued | None]:
    """On PostgreSQL, alone: claim ``queued`` (read ahead) if it is still the oldest pending Signal,
    record its Runs ``record`` (``run_queries.to_record``, the first started) and append the first's
    entry ``new``, with one statement (:func:`_claiming`): whether it claimed, and the oldest
    pending Signal after that one as the statement saw it. ``ending`` (``signals.ending``): the
    Run and Signal before it are ended by the statement too, claimed or not.

    It claims nothing when this process's expected number may be wrong (another process appended
    since, or this one has not yet): the caller then claims in a transaction, as :func:`append`."""
    bound = conn.sync_engine
    expected = _NEXT.get(bound)
    if expected is None:
        return False, None if ending is None else await signal_queries.end(conn, ending)
    seqs = [expected.seq]
    [row] = await direct.run(
        conn, _CLAIMING[ending is not None], count=1, expected=expected.draw, seqs=seqs, **_columns([new]),
        **run_queries.postgres_columns(record, _numbered([new], seqs)), **queued.claim_params(), **(ending or {}),
    )
    *answer, drawn = row
    claimed, after = signal_queries.claimed_and_next(answer)
    if claimed:
        _NEXT[bound] = _Next(drawn + 1, expected.seq + 1)
    elif drawn == expected.draw:
        # Refused for the Signal's sake (an older one committed late, a cancel), its draw the one
        # expected: nothing was appended since, and the next draw follows this one.
        _NEXT[bound] = _Next(drawn + 1, expected.seq)
    return claimed, after


def _columns(new: Sequence[New]) -> dict[str, object]:
    return {"kinds": [entry.kind for entry in new], "leaves": [entry.leaf.decode() for entry in new]}


async def last_instructions(conn: AsyncConnection) -> Entry | None:
    """The newest instructions entry, in ``conn``'s transaction (after :func:`lock`, the one in force)."""
    rows = await direct.run(conn, _LAST_INSTRUCTIONS)
    return _entry(rows[0]) if rows else None


async def lock(conn: AsyncConnection) -> None:
    """Take the ledger's lock in ``conn``'s writing transaction (PostgreSQL; SQLite's write lock is
    already held), so that what is read next stays the newest until commit."""
    if conn.dialect.name == "postgresql":
        await direct.run(conn, _POSTGRES_LOCK)


async def get(store: Store, *, seq: int) -> Entry | None:
    rows = await store.fetch(_GET, number=seq)
    return _entry(rows[0]) if rows else None


async def window(store: Store, *, window: windows.Window) -> list[Entry]:
    """The entries of a cursor window, ascending by number."""
    return [_entry(row) for row in await _WINDOWS.rows(store, window)]


def _entry(row: Sequence[object]) -> Entry:
    seq, kind, leaf = row
    return Entry(int(seq), str(kind), str(leaf).encode())  # type: ignore[call-overload]


# The Runs of a Signal with their entries (none for a Run not started, or one started by a
# process before migration 0015, which named its Run in the entry instead: _BY_RUN).
_OF_SIGNAL = direct.Query(
    sa.select(runs.c.id, runs.c.started_at, *_COLUMNS)
    .select_from(runs.outerjoin(ledger_entries, ledger_entries.c.seq == runs.c.entry_seq))
    .where(runs.c.signal_id == sa.bindparam("signal_id"))
)
_BY_RUN = direct.Query(sa.select(*_COLUMNS).where(ledger_entries.c.run_id == sa.bindparam("run_id")))


async def of_signal(store: Store, *, signal_id: str) -> list[Entry]:
    """The entries of the started Runs of Signal ``signal_id``, ascending by number."""
    found, unnamed = [], []
    for run_id, started_at, *entry in await store.fetch(_OF_SIGNAL, signal_id=signal_id):
        if entry[0] is not None:
            found.append(_entry(entry))
        elif started_at is not None:
            unnamed.append(run_id)
    for run_id in unnamed:  # a scan of the entries: only for a Run started during a rolling restart across 0015
        found += [_entry(row) for row in await store.fetch(_BY_RUN, run_id=run_id)]
    return sorted(found, key=lambda entry: entry.seq)
