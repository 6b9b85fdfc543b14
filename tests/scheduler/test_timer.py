"""The timer loop: woken by writes, sleeping until the soonest fire, surviving failures."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from agent_gateway import clock, config
from agent_gateway.gateway import Gateway
from agent_gateway.scheduler import service, timer
from agent_gateway.store import supervisor
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import schedules
from agent_gateway.store.tables import signals as signals_table

from tests.scheduler.conftest import fired, schedule_rows

# Long enough that a prompt fire in these tests can only come from a wake-up.
MAX_SLEEP_MS = 3_600_000
PATIENCE_S = 300


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``check`` holds; fail after PATIENCE_S (a bound for a broken build, not a timing)."""
    for _ in range(int(PATIENCE_S / 0.01)):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the timer did not act")


@pytest.fixture
def settings(settings: config.Settings, frozen: clock.FrozenClock) -> config.Settings:
    """The shared settings with a long maximum sleep; the clock is frozen before the gateway starts."""
    return dataclasses.replace(settings, scheduler_max_sleep_ms=MAX_SLEEP_MS)


async def test_a_write_wakes_the_timer_which_fires_what_is_due(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    response = await agent.put("/schedules/now", json={"spec": {"kind": "once", "at": clock.now_iso()}, "data": 7})
    assert response.status_code == 201

    async def signalled() -> bool:
        return len(await fired(gateway.store)) == 1

    await eventually(signalled)
    assert (await fired(gateway.store))[0]["data"] == 7
    assert await schedule_rows(gateway.store) == {}


async def test_replacing_a_live_schedule_rearms_the_timer(
    gateway: Gateway, agent: httpx.AsyncClient, frozen: clock.FrozenClock
) -> None:
    later = clock.format_instant(clock.now() + timedelta(minutes=30))
    await agent.put("/schedules/s", json={"spec": {"kind": "once", "at": later}, "data": "old"})
    assert await gateway.schedule_timer.step() == pytest.approx(1800)
    # Re-armed for now: the sleeping timer is woken and fires the new definition only.
    await agent.put("/schedules/s", json={"spec": {"kind": "once", "at": clock.now_iso()}, "data": "new"})

    async def signalled() -> bool:
        return len(await fired(gateway.store)) == 1

    await eventually(signalled)
    frozen.advance(hours=3)
    await gateway.schedule_timer.step()
    assert [p["data"] for p in await fired(gateway.store)] == ["new"]


async def test_a_deleted_schedule_never_fires(
    gateway: Gateway, agent: httpx.AsyncClient, frozen: clock.FrozenClock
) -> None:
    await agent.put("/schedules/s", json={"spec": {"kind": "cron", "expr": "* * * * *"}})
    assert (await agent.delete("/schedules/s")).status_code == 204
    frozen.advance(hours=1)
    assert await gateway.schedule_timer.step() == MAX_SLEEP_MS / 1000
    assert await fired(gateway.store) == []


async def test_step_sleeps_until_the_soonest_fire_or_the_maximum(gateway: Gateway, frozen: clock.FrozenClock) -> None:
    await gateway.schedule_timer.stop()  # only the steps below fire
    step = gateway.schedule_timer.step
    assert await step() == MAX_SLEEP_MS / 1000
    async with gateway.store.transaction() as conn:
        await service.put(conn, "far", {"kind": "once", "at": "2030-03-01T00:00:00Z"})
    assert await step() == MAX_SLEEP_MS / 1000
    async with gateway.store.transaction() as conn:
        await service.put(conn, "soon", {"kind": "cron", "expr": "*/10 * * * * *"})
    assert await step() == pytest.approx(10)
    frozen.advance(seconds=25)
    assert await step() == pytest.approx(5)  # fired once (missed 12:00:20 is not replayed), next at :30
    assert [p["scheduledFor"] for p in await fired(gateway.store)] == ["2030-01-01T12:00:10.000Z"]


async def test_step_drains_more_than_one_batch(
    gateway: Gateway, frozen: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await gateway.schedule_timer.stop()  # only the step below fires
    monkeypatch.setattr(timer, "FIRE_BATCH", 3)
    async with gateway.store.transaction() as conn:
        for index in range(10):
            await service.put(conn, f"s{index}", {"kind": "once", "at": "2030-01-01T12:30:00Z"})
    frozen.advance(hours=1)
    assert await gateway.schedule_timer.step() == MAX_SLEEP_MS / 1000
    assert len(await fired(gateway.store)) == 10


async def test_the_timer_logs_a_failure_and_carries_on(
    gateway: Gateway, agent: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_S", 0.01)
    real_fire_due = service.fire_due
    failures = []

    async def fire_due_failing_once(conn, *, limit):  # type: ignore[no-untyped-def]
        if not failures:
            failures.append(1)
            raise RuntimeError("the database went away")
        return await real_fire_due(conn, limit=limit)

    monkeypatch.setattr(service, "fire_due", fire_due_failing_once)
    with caplog.at_level(logging.ERROR, logger="agent_gateway.store.supervisor"):
        await agent.put("/schedules/now", json={"spec": {"kind": "once", "at": clock.now_iso()}})

        async def signalled() -> bool:
            return len(await fired(gateway.store)) == 1

        await eventually(signalled)
    assert failures == [1]
    assert any(record.getMessage().startswith("scheduler timer failed") for record in caplog.records)


async def test_fire_lateness_is_observed_once_per_committed_fire(
    gateway: Gateway, agent: httpx.AsyncClient, frozen: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose transaction rolls back is fired again: only the fire that commits counts."""
    lateness = "agent_gateway_schedule_fire_lateness_seconds"

    def observed() -> tuple[float, float]:
        return REGISTRY.get_sample_value(f"{lateness}_count") or 0.0, REGISTRY.get_sample_value(f"{lateness}_sum") or 0.0

    later = clock.format_instant(clock.now() + timedelta(minutes=30))
    await agent.put("/schedules/s", json={"spec": {"kind": "once", "at": later}})
    real_earliest_fire = service.earliest_fire
    failures = []

    async def earliest_fire_failing_after_a_fire(conn):  # type: ignore[no-untyped-def]
        # Fails once, in the firing transaction, after fire_due emitted the Signal.
        emitted = (await conn.execute(sa.select(sa.func.count()).select_from(signals_table))).scalar_one()
        if emitted and not failures:
            failures.append(1)
            raise RuntimeError("the database went away")
        return await real_earliest_fire(conn)

    monkeypatch.setattr(service, "earliest_fire", earliest_fire_failing_after_a_fire)
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_S", 0.01)
    count, total = observed()
    frozen.advance(minutes=45)
    # Any write wakes the sleeping timer, which finds "s" due.
    await agent.put("/schedules/far", json={"spec": {"kind": "once", "at": "2100-01-01T00:00:00Z"}})

    async def signalled_and_observed() -> bool:
        # The timer observes a fire once its transaction has committed, which a reader of the
        # Signal may see before the timer's task goes on: wait for both.
        return len(await fired(gateway.store)) == 1 and observed()[0] > count

    await eventually(signalled_and_observed)
    assert failures == [1]
    # Fired 45 minutes into a Schedule due after 30: 15 minutes late, counted once.
    assert observed() == (count + 1, pytest.approx(total + 900))


async def test_stop_ends_a_sleeping_timer(settings: config.Settings) -> None:
    gateway = Gateway(dataclasses.replace(settings, scheduler_max_sleep_ms=MAX_SLEEP_MS))
    await gateway.start()
    task = gateway.schedule_timer._task
    assert task is not None and not task.done()
    await asyncio.sleep(0.05)
    await gateway.schedule_timer.stop()
    assert task.done() and not task.cancelled()
    await gateway.stop()


async def test_a_write_from_another_process_wakes_the_timer(gateway: Gateway, database_url: str) -> None:
    # A second Store on the same database stands for another process (the CLI, another serve).
    elsewhere = Store(database_url)
    try:
        async with elsewhere.transaction() as conn:
            await service.put(conn, "elsewhere", {"kind": "once", "at": clock.now_iso()})
    finally:
        await elsewhere.close()

    async def signalled() -> bool:
        return len(await fired(gateway.store)) == 1

    await eventually(signalled)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_due_schedule_locked_by_another_firer_is_left_to_it(
    gateway: Gateway, frozen: clock.FrozenClock
) -> None:
    await gateway.schedule_timer.stop()  # only the steps below fire
    async with gateway.store.transaction() as conn:
        await service.put(conn, "s", {"kind": "once", "at": clock.format_instant(clock.now() + timedelta(minutes=30))})
    frozen.advance(hours=1)
    async with gateway.store.transaction() as conn:
        # Another firer (another process, in production) holds the row.
        assert len(await schedules.claim_due(conn, now=clock.now_iso(), limit=10)) == 1
        assert await gateway.schedule_timer.step() == timer.LOCKED_RETRY_S
        assert await fired(gateway.store) == []
    # The other firer let go without firing; the next look fires it.
    assert await gateway.schedule_timer.step() == MAX_SLEEP_MS / 1000
    assert len(await fired(gateway.store)) == 1


async def test_step_expecting_a_due_fire_fires_at_once(gateway: Gateway, frozen: clock.FrozenClock) -> None:
    await gateway.schedule_timer.stop()  # only the steps below fire
    async with gateway.store.transaction() as conn:
        await service.put(conn, "s", {"kind": "cron", "expr": "* * * * *"})
    frozen.advance(minutes=1)
    assert await gateway.schedule_timer.step(expect_due=True) == pytest.approx(60)
    assert len(await fired(gateway.store)) == 1
    # Expecting a fire that is not due yet fires nothing early.
    assert await gateway.schedule_timer.step(expect_due=True) == pytest.approx(60)
    assert len(await fired(gateway.store)) == 1
