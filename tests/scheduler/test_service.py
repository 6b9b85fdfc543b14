"""The Scheduler's programmatic API and fire step, on SQLite and PostgreSQL, with a frozen clock."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.scheduler import service
from agent_gateway.scheduler.service import InvalidSchedule, ScheduleNotFound
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import signals

from tests.scheduler.conftest import fire, fired, schedule_rows, signal_count

ONCE = {"kind": "once", "at": "2030-01-01T13:00:00Z"}
HOURLY = {"kind": "cron", "expr": "0 * * * *"}


async def put(store: Store, name: str, spec: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], bool]:
    async with store.transaction() as conn:
        schedule, created = await service.put(conn, name, spec, **kwargs)
    return schedule.to_json(), created


async def get(store: Store, name: str) -> dict[str, Any]:
    async with store.read() as conn:
        return (await service.get(conn, name)).to_json()


# --- definitions --------------------------------------------------------------------------


async def test_put_arms_a_new_schedule_then_replaces_it(store: Store, frozen: clock.FrozenClock) -> None:
    schedule, created = await put(store, "report", ONCE)
    assert created
    assert schedule == {
        "name": "report",
        "spec": {"kind": "once", "at": "2030-01-01T13:00:00.000Z"},
        "data": None,
        "until": None,
        "nextFireAt": "2030-01-01T13:00:00.000Z",
    }
    assert await get(store, "report") == schedule

    replaced, created = await put(
        store, "report", {**HOURLY, "tz": "Europe/Paris"}, data={"b": 1, "a": [None]}, until="2030-01-02T00:00:00+01:00"
    )
    assert not created
    assert replaced == {
        "name": "report",
        "spec": {"kind": "cron", "expr": "0 * * * *", "tz": "Europe/Paris"},
        "data": {"b": 1, "a": [None]},
        "until": "2030-01-01T23:00:00.000Z",
        "nextFireAt": "2030-01-01T13:00:00.000Z",
    }
    assert await get(store, "report") == replaced
    assert list(await schedule_rows(store)) == ["report"]


async def test_tz_defaults_to_utc_whatever_the_host_zone(
    store: Store, frozen: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        schedule, _ = await put(store, "daily", {"kind": "cron", "expr": "0 9 * * *"})
    finally:
        monkeypatch.undo()
        time.tzset()
    assert schedule["spec"]["tz"] == "UTC"
    assert schedule["nextFireAt"] == "2030-01-02T09:00:00.000Z"


async def test_data_is_stored_verbatim(store: Store, frozen: clock.FrozenClock) -> None:
    data = {"z": 1, "a": {"nested": [1.5, "naïve \x00 ☃", True, None]}, "big": 2**63 - 1, "bigger": 2**64, "negative": -(2**70)}
    await put(store, "d", ONCE, data=data)
    stored = await get(store, "d")
    assert stored["data"] == data
    assert list(stored["data"]) == ["z", "a", "big", "bigger", "negative"]


async def test_a_once_at_exactly_now_is_not_past(store: Store, frozen: clock.FrozenClock) -> None:
    schedule, _ = await put(store, "now", {"kind": "once", "at": clock.now_iso()})
    assert schedule["nextFireAt"] == clock.now_iso()


async def test_until_just_after_the_next_occurrence_is_accepted(store: Store, frozen: clock.FrozenClock) -> None:
    schedule, _ = await put(store, "c", HOURLY, until="2030-01-01T13:00:00.001Z")
    assert schedule["until"] == "2030-01-01T13:00:00.001Z"


@pytest.mark.parametrize(
    ("name", "spec", "kwargs"),
    [
        ("bad name", ONCE, {}),
        ("x" * 129, ONCE, {}),
        ("", ONCE, {}),
        ("c", {"kind": "cron", "expr": "not cron"}, {}),
        ("c", {"kind": "cron", "expr": "0 9 * * *", "tz": "Nowhere/Special"}, {}),
        ("c", {"kind": "cron", "expr": "0 9 * * *", "tz": ""}, {}),
        ("c", HOURLY, {"until": "soon"}),
        ("c", HOURLY, {"until": "2030-01-02T00:00:00"}),
        ("c", HOURLY, {"until": 1893456000}),
        ("c", {"kind": "daily", "at": "2030-01-01T13:00:00Z"}, {}),
        ("c", {**ONCE, "extra": True}, {}),
        ("c", {"kind": "once", "at": "2030-01-01T11:59:59.999Z"}, {}),  # past by a millisecond
        ("c", ONCE, {"until": "2030-01-02T00:00:00Z"}),  # a once carrying until
        ("c", HOURLY, {"until": "2030-01-01T13:00:00Z"}),  # until at the next occurrence
        ("c", HOURLY, {"until": "2030-01-01T12:30:00Z"}),  # until before it
        ("c", {"kind": "cron", "expr": "0 0 30 2 *"}, {}),  # never fires
        ("c", ONCE, {"data": {1, 2}}),  # not JSON
    ],
)
async def test_invalid_definitions_raise_the_named_error_and_write_nothing(
    store: Store, frozen: clock.FrozenClock, name: str, spec: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    await put(store, "c", {"kind": "once", "at": "2031-01-01T00:00:00Z"}, data="before")
    with pytest.raises(InvalidSchedule):
        await put(store, name, spec, **kwargs)
    assert await schedule_rows(store) == {"c": "2031-01-01T00:00:00.000Z"}
    assert (await get(store, "c"))["data"] == "before"


async def test_get_and_delete_refuse_a_bad_name_and_miss_an_absent_one(store: Store) -> None:
    async with store.transaction() as conn:
        with pytest.raises(InvalidSchedule):
            await service.get(conn, "a/b")
        with pytest.raises(InvalidSchedule):
            await service.delete(conn, "a b")
        with pytest.raises(ScheduleNotFound):
            await service.get(conn, "absent")
        with pytest.raises(ScheduleNotFound):
            await service.delete(conn, "absent")


async def test_delete_removes_and_a_second_delete_is_not_found(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "gone", ONCE)
    async with store.transaction() as conn:
        await service.delete(conn, "gone")
    async with store.transaction() as conn:
        with pytest.raises(ScheduleNotFound):
            await service.delete(conn, "gone")
    assert await schedule_rows(store) == {}


async def test_list_is_ascending_by_next_fire_then_name_in_byte_order(store: Store, frozen: clock.FrozenClock) -> None:
    later = {"kind": "once", "at": "2030-01-01T14:00:00Z"}
    for name in ["b", "a_b", "a-b", "B", "a.b", "0", "z"]:
        await put(store, name, ONCE)
    await put(store, "early", {"kind": "once", "at": "2030-01-01T12:30:00Z"})
    await put(store, "A", later)
    async with store.read() as conn:
        names = [schedule.name for schedule in await service.list_soonest(conn, 50)]
        first_two = [schedule.name for schedule in await service.list_soonest(conn, 2)]
    assert names == ["early", "0", "B", "a-b", "a.b", "a_b", "b", "z", "A"]
    assert first_two == ["early", "0"]


# --- firing -------------------------------------------------------------------------------


async def test_nothing_fires_before_it_is_due(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "once", ONCE)
    frozen.set("2030-01-01T12:59:59.999Z")
    assert await fire(store) == []
    assert await signal_count(store) == 0


async def test_a_once_fires_once_and_is_deleted_in_the_same_transaction(
    store: Store, frozen: clock.FrozenClock
) -> None:
    await put(store, "once", ONCE, data={"hello": ["world"]})
    frozen.set("2030-01-01T13:00:00.250Z")
    assert len(await fire(store)) == 1
    assert await fired(store) == [
        {
            "scheduleName": "once",
            "scheduledFor": "2030-01-01T13:00:00.000Z",
            "firedAt": "2030-01-01T13:00:00.250Z",
            "data": {"hello": ["world"]},
        }
    ]
    assert await schedule_rows(store) == {}
    async with store.read() as conn:
        # The Run ledger tells it from the operator's Signals.
        assert (await conn.execute(sa.select(signals.c.origin))).scalar_one() == "schedule"
    frozen.advance(days=1)
    assert await fire(store) == []
    assert await signal_count(store) == 1


async def test_a_fire_that_rolls_back_leaves_neither_signal_nor_change(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "once", ONCE)
    await put(store, "cron", HOURLY)
    frozen.set("2030-01-01T13:00:00Z")
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            assert len(await service.fire_due(conn, limit=10)) == 2
            raise RuntimeError("crash before commit")
    assert await signal_count(store) == 0
    assert await schedule_rows(store) == {"cron": "2030-01-01T13:00:00.000Z", "once": "2030-01-01T13:00:00.000Z"}


async def test_a_cron_fires_and_advances_forward_from_now(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "hourly", HOURLY, data=[1])
    frozen.set("2030-01-01T13:00:00.004Z")
    await fire(store)
    assert await schedule_rows(store) == {"hourly": "2030-01-01T14:00:00.000Z"}
    frozen.set("2030-01-01T14:00:00Z")
    await fire(store)
    assert [(p["scheduledFor"], p["firedAt"], p["data"]) for p in await fired(store)] == [
        ("2030-01-01T13:00:00.000Z", "2030-01-01T13:00:00.004Z", [1]),
        ("2030-01-01T14:00:00.000Z", "2030-01-01T14:00:00.000Z", [1]),
    ]
    assert await schedule_rows(store) == {"hourly": "2030-01-01T15:00:00.000Z"}
    assert (await get(store, "hourly"))["nextFireAt"] == "2030-01-01T15:00:00.000Z"


async def test_a_cron_is_retired_with_its_last_signal(store: Store, frozen: clock.FrozenClock) -> None:
    # until equals the second occurrence, which is "at or before until" and so still fires.
    await put(store, "twice", HOURLY, until="2030-01-01T14:00:00Z")
    frozen.set("2030-01-01T13:00:00Z")
    await fire(store)
    assert await schedule_rows(store) == {"twice": "2030-01-01T14:00:00.000Z"}
    frozen.set("2030-01-01T14:00:00Z")
    await fire(store)
    assert [p["scheduledFor"] for p in await fired(store)] == ["2030-01-01T13:00:00.000Z", "2030-01-01T14:00:00.000Z"]
    assert await schedule_rows(store) == {}
    async with store.read() as conn:
        with pytest.raises(ScheduleNotFound):
            await service.get(conn, "twice")


async def test_a_cron_whose_next_occurrence_passes_until_is_retired(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "short", HOURLY, until="2030-01-01T13:59:59.999Z")
    frozen.set("2030-01-01T13:00:00Z")
    await fire(store)
    assert len(await fired(store)) == 1
    assert await schedule_rows(store) == {}


async def test_missed_fires_after_a_restart_fire_once_and_are_never_replayed(
    store: Store, database_url: str, frozen: clock.FrozenClock
) -> None:
    every_minute = {"kind": "cron", "expr": "* * * * *"}
    await put(store, "minutely", every_minute, data="m")
    await put(store, "once", ONCE, data="o")
    await store.close()
    # The gateway was down for 90 minutes and 30 seconds: 91 minutes and the once were missed.
    frozen.set("2030-01-01T13:30:30Z")
    restarted = Store(database_url)
    try:
        await fire(restarted)
        assert [(p["scheduleName"], p["scheduledFor"], p["firedAt"]) for p in await fired(restarted)] == [
            ("minutely", "2030-01-01T12:01:00.000Z", "2030-01-01T13:30:30.000Z"),
            ("once", "2030-01-01T13:00:00.000Z", "2030-01-01T13:30:30.000Z"),
        ]
        assert await schedule_rows(restarted) == {"minutely": "2030-01-01T13:31:00.000Z"}
        assert await fire(restarted) == []
        frozen.set("2030-01-01T13:31:00Z")
        await fire(restarted)
        assert len(await fired(restarted)) == 3
    finally:
        await restarted.close()


async def test_replacing_a_live_schedule_rearms_it(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "s", ONCE, data="old")
    await put(store, "s", {"kind": "once", "at": "2030-01-01T15:00:00Z"}, data="new")
    frozen.set("2030-01-01T13:00:00Z")
    assert await fire(store) == []
    frozen.set("2030-01-01T15:00:00Z")
    await fire(store)
    assert [(p["scheduledFor"], p["data"]) for p in await fired(store)] == [("2030-01-01T15:00:00.000Z", "new")]


async def test_deletion_stops_fires(store: Store, frozen: clock.FrozenClock) -> None:
    await put(store, "s", HOURLY)
    async with store.transaction() as conn:
        await service.delete(conn, "s")
    frozen.set("2030-01-02T00:00:00Z")
    assert await fire(store) == []
    assert await signal_count(store) == 0


async def test_fire_takes_at_most_limit_soonest_first(store: Store, frozen: clock.FrozenClock) -> None:
    for name, at in [("c", "2030-01-01T12:00:03Z"), ("a", "2030-01-01T12:00:01Z"), ("b", "2030-01-01T12:00:02Z")]:
        await put(store, name, {"kind": "once", "at": at})
    frozen.set("2030-01-01T13:00:00Z")
    assert len(await fire(store, limit=2)) == 2
    assert list(await schedule_rows(store)) == ["c"]
    assert len(await fire(store, limit=2)) == 1
    assert [p["scheduleName"] for p in await fired(store)] == ["a", "b", "c"]


async def test_concurrent_firers_announce_each_occurrence_once(store: Store, frozen: clock.FrozenClock) -> None:
    names = [f"s{i:03d}" for i in range(60)]
    for name in names:
        await put(store, name, ONCE if name != "s000" else HOURLY)
    frozen.set("2030-01-01T13:00:00Z")

    async def firer() -> int:
        total = 0
        while batch := await fire(store, limit=7):
            total += len(batch)
        return total

    counts = await asyncio.gather(*(firer() for _ in range(4)))
    payloads = await fired(store)
    assert sum(counts) == len(payloads) == 60
    assert sorted(p["scheduleName"] for p in payloads) == names
    assert await schedule_rows(store) == {"s000": "2030-01-01T14:00:00.000Z"}
