"""Revision 0015: each Run names its ledger entry (runs.entry_seq), where the entry named its Run
(ledger_entries.run_id, uniquely indexed; kept unindexed for older processes)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agent_gateway.store import migrate
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import ledger as queries
from tests.conftest import downgrade, engine_at

pytestmark = pytest.mark.processes

SIGNAL = "01000000-0000-7000-8000-000000000001"
RUNS = ["01000000-0000-7000-8000-00000000000a", "01000000-0000-7000-8000-00000000000b", "01000000-0000-7000-8000-00000000000c"]
AT = "2026-11-29T20:00:00.000Z"


def _table(name: str, *columns: str) -> sa.TableClause:
    return sa.table(name, *(sa.column(column) for column in columns))


signals = _table("signals", "id", "kind", "payload", "emitted_at", "state", "origin")
runs = _table("runs", "id", "signal_id", "session", "prompt", "state", "started_at", "entry_seq")
entries = _table("ledger_entries", "seq", "kind", "leaf", "run_id")


async def test_upgrade_has_each_run_name_its_entry_and_downgrade_gives_the_entries_their_runs_back(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with engine_at(url, "0014") as engine:
        async with engine.begin() as conn:
            await conn.execute(signals.insert().values(
                id=SIGNAL, kind="k", payload="{}", emitted_at=AT, state="processing", origin="operator"
            ))
            # Two Runs started (entries 2 and 3), one still pending (no entry); entry 1 the instructions.
            await conn.execute(runs.insert(), [
                {"id": id, "signal_id": SIGNAL, "session": "s", "prompt": "p", "state": state, "started_at": started}
                for id, state, started in ((RUNS[0], "done", AT), (RUNS[1], "running", AT), (RUNS[2], "pending", None))
            ])
            await conn.execute(entries.insert(), [
                {"seq": 1, "kind": "instructions", "leaf": "{}", "run_id": None},
                {"seq": 2, "kind": "run", "leaf": "{}", "run_id": RUNS[0]},
                {"seq": 3, "kind": "run", "leaf": "{}", "run_id": RUNS[1]},
            ])
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            named = (await conn.execute(sa.select(runs.c.id, runs.c.entry_seq).order_by(runs.c.id))).all()
            columns = {column["name"] for column in await conn.run_sync(lambda c: sa.inspect(c).get_columns("ledger_entries"))}
        assert [tuple(row) for row in named] == [(RUNS[0], 2), (RUNS[1], 3), (RUNS[2], None)]
        assert columns == {"seq", "kind", "leaf", "run_id"}  # unindexed, for older processes

        # A process of the version before, still running during a rolling restart, starts the
        # pending Run and writes its entry as it did: naming the Run, the Run naming nothing.
        async with engine.begin() as conn:
            await conn.execute(runs.update().where(runs.c.id == RUNS[2]).values(state="running", started_at=AT))
            await conn.execute(entries.insert().values(seq=4, kind="run", leaf="{}", run_id=RUNS[2]))
        store = Store(url)
        try:
            # A receipt finds every entry of the Signal's Runs, that one's too.
            assert [entry.seq for entry in await queries.of_signal(store, signal_id=SIGNAL)] == [2, 3, 4]
        finally:
            await store.close()

        async with engine.begin() as conn:
            await conn.run_sync(downgrade, "0014")
        async with engine.connect() as conn:
            back = (await conn.execute(sa.select(entries.c.seq, entries.c.run_id).order_by(entries.c.seq))).all()
        assert [tuple(row) for row in back] == [(1, None), (2, RUNS[0]), (3, RUNS[1]), (4, RUNS[2])]
        # And its unique index again: no Run with two entries.
        with pytest.raises(sa.exc.IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(entries.insert().values(seq=5, kind="run", leaf="{}", run_id=RUNS[0]))
        await migrate.upgrade(engine)  # and up again
