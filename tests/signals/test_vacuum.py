"""The queue's own VACUUM (store/vacuum.py): on PostgreSQL the Signal Worker vacuums the
``signals`` table every ``vacuum.EVERY`` claims, so that the dead index entries its claims
leave behind are not stepped over by every claim after them; SQLite needs none."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.signals import service
from agent_gateway.store import vacuum
from agent_gateway.store.engine import Store

from tests.signals.conftest import GatewayFactory, Recording, finished, until

pytestmark = pytest.mark.processes

# A template Handler: the claim renders its one Prompt and starts its Run (one commit per Signal).
TABLES = {"task": {"template": "do {{ what }}", "session": "s"}}


async def emit_and_finish(gateway: Gateway, count: int) -> None:
    """Emit ``count`` Signals in one transaction, then wait until each is done.

    All of them are pending at once, so their index entries fill pages of their own, which
    outlive the Signals' claims until a VACUUM (a worker that kept up with Signals emitted
    one by one could leave the index as compact as PostgreSQL's own clean-up on insert keeps it).
    """
    async with gateway.store.transaction() as conn:
        ids = [await service.emit(conn, "task", {"what": str(n)}) for n in range(count)]
    for signal_id in ids:
        assert (await finished(gateway.store, signal_id)).state == "done"


async def scalar(store: Store, sql: str) -> Any:
    async with store.read() as conn:
        return (await conn.exec_driver_sql(sql)).scalar()


async def claim_scan_pages(store: Store) -> int:
    """The index pages that finding the oldest pending Signal reads (the claim's scan)."""
    plan = await scalar(
        store,
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        "SELECT position FROM signals WHERE state = 'pending' ORDER BY emitted_at, position LIMIT 1",
    )
    return plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]


async def vacuums(store: Store) -> int:
    return await scalar(store, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'signals'")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_the_worker_vacuums_the_queue_every_so_many_claims(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = await make_gateway(Recording(), handlers=TABLES)
    # Only the worker may vacuum here, whatever the server's autovacuum does.
    async with gateway.store.transaction() as conn:
        await conn.exec_driver_sql("ALTER TABLE signals SET (autovacuum_enabled = false)")
    monkeypatch.setattr(vacuum, "EVERY", 1001)

    await emit_and_finish(gateway, 1000)
    # Fewer claims than EVERY: no vacuum, and the claim steps over each claimed Signal's old entry.
    assert await vacuums(gateway.store) == 0
    crowded = await claim_scan_pages(gateway.store)
    assert crowded > 3

    await emit_and_finish(gateway, 1)  # the 1001st claim
    await until(lambda: vacuums(gateway.store))
    await until(lambda: shrunk(gateway.store, crowded))


async def shrunk(store: Store, crowded: int) -> bool:
    """Whether the claim's scan now reads fewer pages than ``crowded``; if not, vacuum again.

    A VACUUM keeps each version that a live snapshot in the database may still see, and a
    snapshot taken while a transaction runs anywhere on the server (another test's, in
    another database) counts it as running, so it may see them all. The worker's VACUUM
    starts while the 1001st Signal is still worked on, beside such snapshots; so the test
    vacuums again, as the worker's next one would, until one runs without them.
    """
    if await claim_scan_pages(store) < crowded:
        return True
    await asyncio.sleep(0.2)
    await store.vacuum("signals")
    return False


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
async def test_vacuuming_never_fails_a_signal_or_logs_an_error(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vacuum, "EVERY", 1)
    gateway = await make_gateway(Recording(), handlers=TABLES)
    with caplog.at_level(logging.WARNING):
        await emit_and_finish(gateway, 5)
        if gateway.store.dialect == "postgresql":
            await until(lambda: vacuums(gateway.store))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_vacuum_that_fails_is_logged_and_the_claims_go_on(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vacuum, "EVERY", 1)
    failing = vacuum.Vacuum(store, "no_such_table")
    with caplog.at_level(logging.WARNING):
        failing.claimed()
        await until(lambda: caplog.records)
        await failing.close()
    [record] = caplog.records
    assert record.getMessage() == "VACUUM of no_such_table failed: ProgrammingError"
    assert record.action == "vacuum_error"  # type: ignore[attr-defined]
