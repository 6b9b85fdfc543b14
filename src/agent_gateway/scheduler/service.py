"""Schedules: the programmatic API shared by the agent's routes and the operator (spec: Schedule,
Schedule lifecycle, Events, Errors 3).

Every function takes a connection inside the caller's transaction. A
definition is checked completely before anything is written; every way it
can be wrong raises :class:`InvalidSchedule` (the routes turn exactly that
into 400). Writes wake the timer once they commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, jsontext
from agent_gateway.scheduler import spec as specs
from agent_gateway.scheduler.spec import InvalidSchedule
from agent_gateway.signals import service as signals
from agent_gateway.store import engine
from agent_gateway.store.queries import schedules as queries
from agent_gateway.store.queries.schedules import Schedule
from agent_gateway.webhooks import outbox

__all__ = [
    "CHANNEL",
    "FIRED_KIND",
    "Fired",
    "InvalidSchedule",
    "Schedule",
    "ScheduleNotFound",
    "delete",
    "earliest_fire",
    "fire_due",
    "get",
    "list_soonest",
    "put",
    "put_body",
]

CHANNEL = "schedules"
FIRED_KIND = "service_schedule_fired"
BODY_FIELDS = frozenset({"spec", "data", "until"})


class ScheduleNotFound(errors.NotFound):
    """No live Schedule has that name."""


async def put(
    conn: AsyncConnection,
    name: str,
    spec: Mapping[str, Any],
    *,
    data: Any = None,
    until: str | None = None,
) -> tuple[Schedule, bool]:
    """Arm the Schedule ``name``, replacing a live one of that name; return it and whether it is new.

    ``spec`` is ``{"kind": "once", "at": INSTANT}`` or ``{"kind": "cron",
    "expr": EXPR, "tz"?: ZONE}`` (tz defaults to UTC); ``data`` is any JSON
    value, echoed in every fired Signal; ``until`` (cron only) is an instant
    after which it stops. Spec "Schedule lifecycle": the row is the arming,
    and its first fire is derived forward from now.

    Raises :class:`InvalidSchedule`, before writing anything, for a bad name,
    spec or until, a once carrying ``until`` or already past, a cron whose
    ``until`` is at or before its next occurrence, and ``data`` that is not JSON.
    """
    specs.check_name(name)
    parsed = specs.from_json(spec)
    end = None if until is None else specs.parse_instant("until", until)
    if end is not None and isinstance(parsed, specs.Once):
        raise InvalidSchedule("until is for cron Schedules only; a once fires a single time")
    try:
        jsontext.dumps(data)
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"data is not JSON: {exc}") from None

    now = clock.now()
    first = specs.next_fire(parsed, now)
    if first is None:
        raise InvalidSchedule("spec.at is already past" if isinstance(parsed, specs.Once) else "spec.expr never fires")
    if end is not None and end <= first:
        raise InvalidSchedule(f"until is at or before the next occurrence ({clock.format_instant(first)})")

    schedule = _row(name, parsed, data, end, first)
    updated_at = clock.format_instant(now)
    # Insert, or else replace. On PostgreSQL the row can vanish in between (a
    # concurrent fire spent it, or a DELETE): then the name is new after all.
    while True:
        if await queries.insert_new(conn, schedule=schedule, updated_at=updated_at):
            created = True
            break
        if await queries.replace(conn, schedule=schedule, updated_at=updated_at):
            created = False
            break
    engine.notify(conn, CHANNEL)
    return schedule, created


async def put_body(conn: AsyncConnection, name: str, body: Any) -> tuple[Schedule, bool]:
    """:func:`put` from a ``PUT /schedules/{name}`` body: an object of ``spec``, ``data``?, ``until``?.

    An unknown field, or ``spec`` missing, raises :class:`InvalidSchedule`;
    ``until: null`` is no ``until``.
    """
    if not isinstance(body, Mapping):
        raise InvalidSchedule("the body must be a JSON object")
    unknown = sorted(set(body) - BODY_FIELDS)
    if unknown:
        raise InvalidSchedule(f"unknown field {unknown[0]!r}")
    if "spec" not in body:
        raise InvalidSchedule("spec is required")
    return await put(conn, name, body["spec"], data=body.get("data"), until=body.get("until"))


def _row(name: str, parsed: specs.Spec, data: Any, until: datetime | None, first: datetime) -> Schedule:
    fields = parsed.to_json()
    return Schedule(
        name=name,
        kind=fields["kind"],
        at=fields.get("at"),
        expr=fields.get("expr"),
        tz=fields.get("tz"),
        until=None if until is None else clock.format_instant(until),
        data=data,
        next_fire_at=clock.format_instant(first),
    )


async def get(conn: AsyncConnection, name: str) -> Schedule:
    """The live Schedule ``name``; raises :class:`InvalidSchedule` (bad name) or :class:`ScheduleNotFound`."""
    schedule = await queries.get(conn, name=specs.check_name(name))
    if schedule is None:
        raise ScheduleNotFound(f"no live Schedule is named {name!r}")
    return schedule


async def list_soonest(conn: AsyncConnection, limit: int) -> list[Schedule]:
    """Up to ``limit`` live Schedules, ascending by next fire, ties by name."""
    return await queries.soonest(conn, limit=limit)


async def delete(conn: AsyncConnection, name: str) -> None:
    """Cancel the live Schedule ``name``: all its future fires stop.

    Raises :class:`InvalidSchedule` (bad name) or :class:`ScheduleNotFound`
    (not an idempotent success: spec "Schedule lifecycle").
    """
    if not await queries.delete(conn, name=specs.check_name(name)):
        raise ScheduleNotFound(f"no live Schedule is named {name!r}")
    engine.notify(conn, CHANNEL)


async def earliest_fire(conn: AsyncConnection) -> datetime | None:
    """When the next Schedule is due, if any is live."""
    earliest = await queries.earliest_fire(conn)
    return None if earliest is None else clock.parse_instant(earliest)


@dataclasses.dataclass(frozen=True)
class Fired:
    """One fire: the Signal it emitted, and how many seconds after its ``nextFireAt`` it fired."""

    signal_id: str
    lateness_s: float


async def fire_due(conn: AsyncConnection, *, limit: int) -> list[Fired]:
    """Fire up to ``limit`` Schedules that are due now; return what was fired.

    Spec "Schedule lifecycle" and "Events": each fire emits one
    ``service_schedule_fired`` Signal ``{scheduleName, scheduledFor, firedAt,
    data}`` and, in the same (the caller's) transaction, deletes a once,
    retires a cron with no further occurrence at or before its ``until``, or
    advances the cron to its next occurrence derived forward from now. A fire
    missed for any length of time therefore happens once, late, and is never
    replayed. Claimed rows are exclusive to this transaction, so each
    occurrence is announced once however many firers run.
    """
    emitted, announced, spent, advanced = [], [], [], {}
    for schedule in await queries.claim_due(conn, now=clock.now_iso(), limit=limit):
        fired_at = clock.now()
        lateness = fired_at - clock.parse_instant(schedule.next_fire_at)
        payload = {
            "scheduleName": schedule.name,
            "scheduledFor": schedule.next_fire_at,
            "firedAt": clock.format_instant(fired_at),
            "data": schedule.data,
        }
        [signal] = await signals.emit_signals(conn, FIRED_KIND, [payload], origin=signals.SCHEDULE)
        announced.append(signal)
        emitted.append(Fired(signal.id, max(0.0, lateness.total_seconds())))
        following = None
        if schedule.kind == "cron":
            assert schedule.expr is not None and schedule.tz is not None
            following = specs.next_fire(specs.Cron(schedule.expr, schedule.tz), fired_at)
        if following is None or (schedule.until is not None and following > clock.parse_instant(schedule.until)):
            spent.append(schedule.name)
        else:
            advanced[schedule.name] = clock.format_instant(following)
    # One statement each for the whole batch: a burst of fires costs fewer round trips.
    await queries.retire(conn, names=spent)
    await queries.advance(conn, next_fire_at=advanced)
    # schedule.fired carries the Signal each fire emitted: its payload is the fire's record.
    await outbox.add(conn, outbox.SCHEDULE_FIRED, ((s.emitted_at, s.to_json()) for s in announced))
    return emitted
