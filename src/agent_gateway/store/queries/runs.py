"""Queries on Runs.

As for Signals, every transition names the state it leaves in its WHERE
clause (spec: Run states are one-way).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import records
from agent_gateway.store import direct
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import runs, signals

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
STATES = (PENDING, RUNNING, DONE, FAILED)
# No Run ledger entries (insert's and postgres_columns' default).
_NONE: Mapping[str, int] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class Run:
    id: str
    signal_id: str
    session: str | None
    prompt: str
    state: str
    error: str | None
    started_at: str | None
    ended_at: str | None

    def to_json(self) -> records.Run:
        return {
            "id": self.id,
            "signalId": self.signal_id,
            "session": self.session,
            "prompt": self.prompt,
            "state": self.state,
            "error": self.error,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
        }

    @classmethod
    def from_row(cls, row: sa.Row) -> Run:
        return cls(
            row.id, row.signal_id, row.session, row.prompt, row.state, row.error, row.started_at, row.ended_at
        )


_COLUMNS = (
    runs.c.id,
    runs.c.signal_id,
    runs.c.session,
    runs.c.prompt,
    runs.c.state,
    runs.c.error,
    runs.c.started_at,
    runs.c.ended_at,
)


async def record(
    conn: AsyncConnection, *, signal_id: str, prompts: Iterable[tuple[str, str, str]], first_started_at: str | None = None
) -> list[Run]:
    """Record ``(id, session, prompt)`` Runs of one Signal as ``pending``, in this order.

    With ``first_started_at`` the first is recorded ``running`` since then
    instead: the same state a :func:`start` right after would give it, for one
    statement less in the transaction that hands it to the agent.
    """
    recorded = to_record(signal_id=signal_id, prompts=prompts, first_started_at=first_started_at)
    await insert(conn, recorded)
    return recorded


def to_record(
    *, signal_id: str, prompts: Iterable[tuple[str, str, str]], first_started_at: str | None = None
) -> list[Run]:
    """The Runs :func:`record` would record, not yet written: :func:`insert` writes them, or, on
    PostgreSQL, the Run ledger's statement with their first's entry (``store.queries.ledger``)."""
    recorded = [Run(id, signal_id, session, prompt, PENDING, None, None, None) for id, session, prompt in prompts]
    if recorded and first_started_at is not None:
        recorded[0] = dataclasses.replace(recorded[0], state=RUNNING, started_at=first_started_at)
    return recorded


async def insert(conn: AsyncConnection, recorded: Sequence[Run], entries: Mapping[str, int] = _NONE) -> None:
    """Write Runs made by :func:`to_record`; ``entries``: the Run ledger entry's number of each
    started one, by its id (``store.queries.ledger``)."""
    if recorded:
        await direct.run_many(
            conn,
            _INSERT,
            [
                {
                    "id": run.id, "signal_id": run.signal_id, "session": run.session, "prompt": run.prompt,
                    "state": run.state, "started_at": run.started_at, "entry_seq": entries.get(run.id),
                }
                for run in recorded
            ],
        )


async def number(conn: AsyncConnection, entries: Mapping[str, int]) -> None:
    """Name the Run ledger entries of Runs already recorded and started since (``entries``: its
    number by the Run's id), in the transaction that started them and appended those."""
    await direct.run_many(conn, _NUMBER, [{"run_id": id, "entry_seq": seq} for id, seq in entries.items()])


# :func:`insert` as a data-modifying CTE of another PostgreSQL statement (its parameters from
# :func:`postgres_columns`): the Runs a Signal Worker records as it starts the first go in with
# that Run's ledger entry, one round trip less per Run start.
POSTGRES_INSERT = (
    "INSERT INTO runs (id, signal_id, session, prompt, state, started_at, entry_seq) "
    "SELECT * FROM unnest(CAST(:record_ids AS varchar[]), CAST(:record_signal_ids AS varchar[]), "
    "CAST(:record_sessions AS text[]), CAST(:record_prompts AS text[]), CAST(:record_states AS varchar[]), "
    "CAST(:record_started_at AS varchar[]), CAST(:record_entry_seqs AS bigint[]))"
)


def postgres_columns(recorded: Sequence[Run], entries: Mapping[str, int] = _NONE) -> dict[str, list[Any]]:
    """:data:`POSTGRES_INSERT`'s parameters (``entries`` as :func:`insert` takes them)."""
    return {
        "record_ids": [run.id for run in recorded], "record_signal_ids": [run.signal_id for run in recorded],
        "record_sessions": [run.session for run in recorded], "record_prompts": [run.prompt for run in recorded],
        "record_states": [run.state for run in recorded], "record_started_at": [run.started_at for run in recorded],
        "record_entry_seqs": [entries.get(run.id) for run in recorded],
    }


async def get(conn: AsyncConnection, *, id: str) -> Run | None:
    row = (await conn.execute(sa.select(*_COLUMNS).where(runs.c.id == id))).first()
    return Run.from_row(row) if row else None


async def get_many(conn: AsyncConnection, *, ids: Sequence[str]) -> list[Run]:
    """The Runs with these ids, in the order they were recorded."""
    query = sa.select(*_COLUMNS).where(runs.c.id.in_(ids)).order_by(runs.c.position)
    return [Run.from_row(row) for row in await conn.execute(query)]


def _newest(*, limit: object, signal_id: object = None, state: object = None) -> sa.Select:
    """Newest first by startedAt; Runs not started yet come first, newest recorded first."""
    query = (
        sa.select(*_COLUMNS)
        .order_by(runs.c.started_at.desc().nulls_first(), runs.c.position.desc())
        .limit(limit)
    )
    if signal_id is not None:
        query = query.where(runs.c.signal_id == signal_id)
    if state is not None:
        query = query.where(runs.c.state == state)
    return query


async def newest(
    conn: AsyncConnection, *, limit: int, signal_id: str | None = None, state: str | None = None
) -> list[Run]:
    """Up to ``limit`` Runs (:func:`_newest`'s order), of one Signal and one state when given."""
    return [Run.from_row(row) for row in await conn.execute(_newest(limit=limit, signal_id=signal_id, state=state))]


# The Agent server's GET /runs, which agents poll for their Runs: one statement straight on the
# driver (see store.direct), outside any transaction; without the Signal, then with it.
_RECENT = tuple(
    direct.Query(_newest(limit=sa.bindparam("limit", type_=sa.Integer), signal_id=of_signal))
    for of_signal in (None, sa.bindparam("signal_id"))
)


async def recent(store: Store, *, limit: int, signal_id: str | None = None) -> list[Run]:
    """:func:`newest` without a state, read outside any transaction."""
    of_signal = {} if signal_id is None else {"signal_id": signal_id}
    return [Run(*row) for row in await store.fetch(_RECENT[bool(of_signal)], limit=limit, **of_signal)]


# The worker's writes, built once and run straight on the driver (see store.direct): they are its hot path.
_INSERT = direct.Query(
    runs.insert()
    .values({
        column: sa.bindparam(column)
        for column in ("id", "signal_id", "session", "prompt", "state", "started_at", "entry_seq")
    })
    .inline()  # no RETURNING of the new row's position
)
_NUMBER = direct.Query(
    runs.update().where(runs.c.id == sa.bindparam("run_id")).values(entry_seq=sa.bindparam("entry_seq"))
)
_START = direct.Query(
    runs.update()
    .where(runs.c.id == sa.bindparam("run_id"), runs.c.state == PENDING)
    .values(state=RUNNING, started_at=sa.bindparam("new_started_at"))
    .returning(runs.c.id)
)
# Its parameters are named apart from the Signal's (store.queries.signals joins the two in one statement).
FINISH = direct.Query(
    runs.update()
    .where(runs.c.id == sa.bindparam("run_id"), runs.c.state == RUNNING)
    .values(state=sa.bindparam("run_state"), error=sa.bindparam("run_error"), ended_at=sa.bindparam("run_ended_at"))
    .returning(runs.c.id)
)


async def start(conn: AsyncConnection, *, id: str, started_at: str) -> bool:
    """Move a ``pending`` Run to ``running``."""
    return len(await direct.run(conn, _START, run_id=id, new_started_at=started_at)) == 1


async def finish(conn: AsyncConnection, *, id: str, error: str | None, ended_at: str) -> bool:
    """End a ``running`` Run: ``done`` without an error, ``failed`` with one."""
    return len(await direct.run(conn, FINISH, **finish_params(id=id, error=error, ended_at=ended_at))) == 1


def finish_params(*, id: str, error: str | None, ended_at: str) -> dict[str, str | None]:
    """The parameters of :data:`FINISH`."""
    return {"run_id": id, "run_state": DONE if error is None else FAILED, "run_error": error, "run_ended_at": ended_at}


async def fail_unfinished(
    conn: AsyncConnection, *, state: str, error: str, ended_at: str, signal_id: str | None = None
) -> list[str]:
    """Fail the Runs in ``state`` of one Signal, or of every ``processing`` Signal when none is
    named; return their ids."""
    if signal_id is None:
        of_signals = runs.c.signal_id.in_(sa.select(signals.c.id).where(signals.c.state == "processing"))
    else:
        of_signals = runs.c.signal_id == signal_id
    query = (
        runs.update()
        .where(of_signals, runs.c.state == state)
        .values(state=FAILED, error=error, ended_at=ended_at)
        .returning(runs.c.id)
    )
    return list((await conn.execute(query)).scalars())



async def cancel(conn: AsyncConnection, *, id: str, error: str, ended_at: str) -> Run | None:
    """Fail a ``pending`` or ``running`` Run with ``error``; None when it has ended or does not exist."""
    query = (
        runs.update()
        .where(runs.c.id == id, runs.c.state.in_((PENDING, RUNNING)))
        .values(state=FAILED, error=error, ended_at=ended_at)
        .returning(*_COLUMNS)
    )
    row = (await conn.execute(query)).first()
    return Run.from_row(row) if row else None


async def count_failed_with(conn: AsyncConnection, *, error: str) -> int:
    """How many Runs are ``failed`` with exactly ``error``."""
    query = sa.select(sa.func.count()).where(runs.c.state == FAILED, runs.c.error == error)
    return (await conn.execute(query)).scalar_one()
