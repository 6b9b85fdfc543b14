"""Queries on Schedules. A row is a live Schedule; spent and cancelled ones are deleted."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import records
from agent_gateway.store.tables import schedules


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    kind: str
    at: str | None
    expr: str | None
    tz: str | None
    until: str | None
    data: Any
    next_fire_at: str

    def to_json(self) -> records.Schedule:
        if self.kind == "once":
            spec = {"kind": "once", "at": self.at}
        else:
            spec = {"kind": "cron", "expr": self.expr, "tz": self.tz}
        return {
            "name": self.name,
            "spec": spec,
            "data": self.data,
            "until": self.until,
            "nextFireAt": self.next_fire_at,
        }

    @classmethod
    def from_row(cls, row: sa.Row) -> Schedule:
        return cls(row.name, row.kind, row.at, row.expr, row.tz, row.until, row.data, row.next_fire_at)


_COLUMNS = (
    schedules.c.name,
    schedules.c.kind,
    schedules.c.at,
    schedules.c.expr,
    schedules.c.tz,
    schedules.c.until,
    schedules.c.data,
    schedules.c.next_fire_at,
)


def _by_name(conn: AsyncConnection) -> sa.ColumnElement[str]:
    # Ties are broken by name in byte order on both backends, whatever the
    # PostgreSQL database's default collation.
    return schedules.c.name.collate("C") if conn.dialect.name == "postgresql" else schedules.c.name


async def get(conn: AsyncConnection, *, name: str) -> Schedule | None:
    row = (await conn.execute(sa.select(*_COLUMNS).where(schedules.c.name == name))).first()
    return Schedule.from_row(row) if row else None


async def soonest(conn: AsyncConnection, *, limit: int) -> list[Schedule]:
    """Up to ``limit`` Schedules ascending by next fire, ties by name."""
    query = sa.select(*_COLUMNS).order_by(schedules.c.next_fire_at, _by_name(conn)).limit(limit)
    return [Schedule.from_row(row) for row in await conn.execute(query)]


async def earliest_fire(conn: AsyncConnection) -> str | None:
    """The earliest ``next_fire_at`` of any Schedule."""
    return (await conn.execute(sa.select(sa.func.min(schedules.c.next_fire_at)))).scalar()


async def replace(conn: AsyncConnection, *, schedule: Schedule, updated_at: str) -> bool:
    """Overwrite the Schedule of the same name; False if there is none."""
    query = (
        schedules.update()
        .where(schedules.c.name == schedule.name)
        .values(**_values(schedule), updated_at=updated_at)
        .returning(schedules.c.name)
    )
    return (await conn.execute(query)).first() is not None


async def insert_new(conn: AsyncConnection, *, schedule: Schedule, updated_at: str) -> bool:
    """Insert the Schedule unless its name is taken; False if it was."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    query = (
        dialect.insert(schedules)
        .values(name=schedule.name, **_values(schedule), updated_at=updated_at)
        .on_conflict_do_nothing(index_elements=[schedules.c.name])
        .returning(schedules.c.name)
    )
    return (await conn.execute(query)).first() is not None


def _values(schedule: Schedule) -> dict[str, Any]:
    return {
        "kind": schedule.kind,
        "at": schedule.at,
        "expr": schedule.expr,
        "tz": schedule.tz,
        "until": schedule.until,
        "data": schedule.data,
        "next_fire_at": schedule.next_fire_at,
    }


async def delete(conn: AsyncConnection, *, name: str) -> bool:
    """Delete the Schedule; False if there was none."""
    query = schedules.delete().where(schedules.c.name == name).returning(schedules.c.name)
    return (await conn.execute(query)).first() is not None


async def claim_due(conn: AsyncConnection, *, now: str, limit: int) -> list[Schedule]:
    """Lock up to ``limit`` Schedules due at ``now`` for this transaction to fire, soonest first.

    On PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED``, so concurrent
    firers take disjoint rows; a writer's committed change is re-checked against
    ``now`` before the lock is granted. On SQLite the whole write transaction is
    exclusive (BEGIN IMMEDIATE).
    """
    query = (
        sa.select(*_COLUMNS)
        .where(schedules.c.next_fire_at <= now)
        .order_by(schedules.c.next_fire_at, schedules.c.name)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [Schedule.from_row(row) for row in await conn.execute(query)]


async def retire(conn: AsyncConnection, *, names: list[str]) -> None:
    """Delete the named Schedules (fired for the last time)."""
    if names:
        await conn.execute(schedules.delete().where(schedules.c.name.in_(names)))


async def advance(conn: AsyncConnection, *, next_fire_at: dict[str, str]) -> None:
    """Move each named Schedule to its next fire."""
    if next_fire_at:
        query = (
            schedules.update()
            .where(schedules.c.name == sa.bindparam("schedule_name"))
            .values(next_fire_at=sa.bindparam("next"))
        )
        await conn.execute(query, [{"schedule_name": name, "next": at} for name, at in next_fire_at.items()])
