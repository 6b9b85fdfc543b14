"""Scheduler fixtures: a frozen clock and a look at the Signals the Scheduler emitted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.scheduler import service
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import schedules, signals

START = "2030-01-01T12:00:00.000Z"


@pytest.fixture
def frozen() -> Iterator[clock.FrozenClock]:
    """The clock, stopped at :data:`START` until a test moves it."""
    source = clock.FrozenClock(START)
    with clock.use(source):
        yield source


async def fired(store: Store) -> list[dict[str, Any]]:
    """Payloads of every ``service_schedule_fired`` Signal, in emission order."""
    query = sa.select(signals.c.payload).where(signals.c.kind == service.FIRED_KIND).order_by(signals.c.position)
    async with store.read() as conn:
        return [row.payload for row in await conn.execute(query)]


async def signal_count(store: Store) -> int:
    async with store.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(signals))).scalar_one()


async def schedule_rows(store: Store) -> dict[str, str]:
    """Every stored Schedule row: name to next_fire_at."""
    async with store.read() as conn:
        return dict((await conn.execute(sa.select(schedules.c.name, schedules.c.next_fire_at))).all())


async def fire(store: Store, limit: int = 100) -> list[service.Fired]:
    """One fire step in its own transaction, as the timer takes it."""
    async with store.transaction() as conn:
        return await service.fire_due(conn, limit=limit)
