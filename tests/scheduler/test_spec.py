"""The Schedule spec: strict parsing and the pure next-fire math, DST included (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway import clock
from agent_gateway.scheduler import spec as specs
from agent_gateway.scheduler.spec import Cron, InvalidSchedule, Once


def instant(text: str) -> datetime:
    return clock.parse_instant(text)


def walk(expr: str, tz: str, start: str, count: int) -> list[str]:
    """``count`` successive fires, each derived forward from the previous one."""
    fires, after = [], instant(start)
    for _ in range(count):
        following = specs.next_fire(Cron(expr, tz), after)
        assert following is not None
        fires.append(clock.format_instant(following))
        after = following
    return fires


# --- names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "A-z_0.9", "x" * 128, ".", "..", "-"])
def test_name_pattern_accepts(name: str) -> None:
    assert specs.check_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 129, "a/b", "a b", "é", "a\x00", "a\n", None, 7])
def test_name_pattern_refuses(name: object) -> None:
    with pytest.raises(InvalidSchedule):
        specs.check_name(name)


# --- instants -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2030-01-02T03:04:05Z", "2030-01-02T03:04:05.000Z"),
        ("2030-01-02T03:04:05.123456789+02:00", "2030-01-02T01:04:05.123Z"),
        ("2030-01-02T03:04-05:30", "2030-01-02T08:34:00.000Z"),
    ],
)
def test_instants_with_an_offset_are_accepted_and_truncated_to_milliseconds(text: str, canonical: str) -> None:
    assert clock.format_instant(specs.parse_instant("at", text)) == canonical


@pytest.mark.parametrize(
    "value",
    [
        "2030-01-02T03:04:05",  # no offset: a local time is ambiguous
        "2030-02-30T00:00:00Z",
        "2030-01-02",
        "tomorrow",
        "",
        "0001-01-01T00:00:00+01:00",  # before the first representable instant
        "9999-12-31T23:00:00-05:00",  # after the last one
        1893456000,
        None,
        ["2030-01-02T03:04:05Z"],
    ],
)
def test_malformed_instants_are_refused(value: object) -> None:
    with pytest.raises(InvalidSchedule):
        specs.parse_instant("at", value)


# --- time zones ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tz", ["UTC", "Europe/Paris", "Australia/Sydney", "Etc/GMT+5", "America/Argentina/Buenos_Aires"]
)
def test_iana_zones_are_accepted(tz: str) -> None:
    assert specs.check_tz(tz) == tz


@pytest.mark.parametrize(
    "tz",
    [
        "",
        "utc",
        "localtime",
        "America",
        "Mars/Olympus",
        "../etc/passwd",
        "/usr/share/zoneinfo/UTC",
        "UTC ",
        "\x00",
        None,
        0,
    ],
)
def test_empty_unknown_and_host_zones_are_refused(tz: object) -> None:
    with pytest.raises(InvalidSchedule):
        specs.check_tz(tz)


# --- cron expressions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "0 9 * * *",
        "0 9 * * MON-FRI",
        "0 0 1 JAN,JUL *",
        "*/15 8-18 * * mon,wed,fri",
        "1,2,3 */2 1-5 * *",
        "*/10 * * * * *",  # six fields: seconds first
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "@midnight",
        "10" + ",0" * 507 + " * * * *",  # exactly the length limit
    ],
)
def test_cron_expressions_are_accepted(expr: str) -> None:
    assert len(expr) <= specs.MAX_EXPR_CHARS
    assert specs.check_expr(expr) == expr


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "0 0 1 1 * 2030",  # seven fields would be croniter's year
        "0 0 0 1 1 * 2030",
        "60 * * * *",
        "0 24 * * *",
        "0 0 0 * *",
        "0 0 * 13 *",
        "*/0 * * * *",
        "mon * * * *",
        "R * * * *",  # random: would move every time it is derived
        "0 R(1-5) * * *",
        "H * * * *",
        "0 H/2 * * *",
        "@reboot",
        "@every 5m",
        " @hourly ",
        "1" + ",0" * 507 + " * * * * *",  # one past the length limit
        None,
        5,
        ["0", "9", "*", "*", "*"],
    ],
)
def test_bad_cron_expressions_are_refused(expr: object) -> None:
    with pytest.raises(InvalidSchedule):
        specs.check_expr(expr)


# --- the spec object ----------------------------------------------------------------------


def test_from_json_once_and_cron() -> None:
    assert specs.from_json({"kind": "once", "at": "2030-01-01T00:00:00Z"}) == Once(instant("2030-01-01T00:00:00Z"))
    assert specs.from_json({"kind": "cron", "expr": "@daily"}) == Cron("@daily", "UTC")
    assert specs.from_json({"kind": "cron", "expr": "@daily", "tz": "Asia/Tokyo"}).to_json() == {
        "kind": "cron",
        "expr": "@daily",
        "tz": "Asia/Tokyo",
    }


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        "once",
        {},
        {"kind": "weekly", "at": "2030-01-01T00:00:00Z"},
        {"kind": "ONCE", "at": "2030-01-01T00:00:00Z"},
        {"kind": ["once"], "at": "2030-01-01T00:00:00Z"},
        {"at": "2030-01-01T00:00:00Z"},
        {"kind": "once"},
        {"kind": "once", "at": "2030-01-01T00:00:00Z", "tz": "UTC"},
        {"kind": "once", "at": "2030-01-01T00:00:00Z", "extra": 1},
        {"kind": "cron"},
        {"kind": "cron", "expr": "@daily", "at": "2030-01-01T00:00:00Z"},
        {"kind": "cron", "expr": "@daily", "tz": None},
        {"kind": "cron", "expr": "@daily", "tz": ""},
    ],
)
def test_from_json_refuses(value: object) -> None:
    with pytest.raises(InvalidSchedule):
        specs.from_json(value)


# --- next fire ----------------------------------------------------------------------------


def test_once_fires_at_its_instant_unless_it_is_past() -> None:
    at = instant("2030-01-01T00:00:00Z")
    assert specs.next_fire(Once(at), at) == at
    assert specs.next_fire(Once(at), at - timedelta(days=1)) == at
    assert specs.next_fire(Once(at), at + timedelta(milliseconds=1)) is None


def test_cron_fires_strictly_after() -> None:
    assert walk("0 9 * * *", "UTC", "2030-01-01T09:00:00Z", 2) == [
        "2030-01-02T09:00:00.000Z",
        "2030-01-03T09:00:00.000Z",
    ]
    assert walk("0 9 * * *", "UTC", "2030-01-01T08:59:59.999Z", 1) == ["2030-01-01T09:00:00.000Z"]
    assert walk("*/10 * * * * *", "UTC", "2030-01-01T00:00:00.001Z", 2) == [
        "2030-01-01T00:00:10.000Z",
        "2030-01-01T00:00:20.000Z",
    ]


def test_cron_is_evaluated_in_its_zone() -> None:
    # 2030-01-07 is a Monday; 09:00 in Tokyo (+09:00) is midnight UTC.
    assert walk("0 9 * * MON", "Asia/Tokyo", "2030-01-01T00:00:00Z", 2) == [
        "2030-01-07T00:00:00.000Z",
        "2030-01-14T00:00:00.000Z",
    ]
    assert walk("@daily", "America/Los_Angeles", "2030-01-01T00:00:00Z", 1) == ["2030-01-01T08:00:00.000Z"]


def test_macros() -> None:
    start = "2030-01-01T00:30:00Z"  # a Tuesday
    assert walk("@hourly", "UTC", start, 1) == ["2030-01-01T01:00:00.000Z"]
    assert walk("@daily", "UTC", start, 1) == ["2030-01-02T00:00:00.000Z"]
    assert walk("@weekly", "UTC", start, 1) == ["2030-01-06T00:00:00.000Z"]
    assert walk("@monthly", "UTC", start, 1) == ["2030-02-01T00:00:00.000Z"]
    assert walk("@yearly", "UTC", start, 1) == ["2031-01-01T00:00:00.000Z"]


def test_a_cron_that_never_fires_has_no_next_fire() -> None:
    assert specs.next_fire(Cron("0 0 30 2 *"), instant("2030-01-01T00:00:00Z")) is None


# Daylight saving, northern hemisphere: America/New_York, 2026.
# Spring forward Sunday 8 March at 02:00 EST (07:00Z) to 03:00 EDT;
# fall back Sunday 1 November at 02:00 EDT (06:00Z) to 01:00 EST.


def test_new_york_spring_forward_skipped_time_fires_once_right_after_the_gap() -> None:
    assert walk("30 2 * * *", "America/New_York", "2026-03-08T06:00:00Z", 2) == [
        "2026-03-08T07:00:00.000Z",  # 02:30 does not exist: 03:00 EDT
        "2026-03-09T06:30:00.000Z",  # 02:30 EDT the next day
    ]


def test_new_york_spring_forward_several_skipped_times_collapse_into_one_fire() -> None:
    assert walk("*/15 * * * *", "America/New_York", "2026-03-08T06:50:00Z", 3) == [
        "2026-03-08T07:00:00.000Z",  # 02:00, 02:15, 02:30, 02:45 and 03:00 itself
        "2026-03-08T07:15:00.000Z",
        "2026-03-08T07:30:00.000Z",
    ]


def test_new_york_fall_back_repeated_time_fires_once() -> None:
    assert walk("30 1 * * *", "America/New_York", "2026-11-01T04:00:00Z", 2) == [
        "2026-11-01T05:30:00.000Z",  # 01:30 EDT, the first occurrence
        "2026-11-02T06:30:00.000Z",  # not 01:30 EST an hour later
    ]


def test_new_york_fall_back_repeated_stretch_fires_nothing_twice() -> None:
    assert walk("*/30 * * * *", "America/New_York", "2026-11-01T04:40:00Z", 4) == [
        "2026-11-01T05:00:00.000Z",  # 01:00 EDT
        "2026-11-01T05:30:00.000Z",  # 01:30 EDT
        "2026-11-01T07:00:00.000Z",  # 02:00 EST; 01:00 and 01:30 EST are repeats
        "2026-11-01T07:30:00.000Z",
    ]


def test_new_york_counting_from_inside_the_repeated_stretch() -> None:
    # 06:20Z is 01:20 EST, the second pass: everything up to 02:00 already fired.
    assert walk("*/15 * * * *", "America/New_York", "2026-11-01T06:20:00Z", 2) == [
        "2026-11-01T07:00:00.000Z",
        "2026-11-01T07:15:00.000Z",
    ]
    assert walk("* * * * * *", "America/New_York", "2026-11-01T06:59:58.500Z", 2) == [
        "2026-11-01T07:00:00.000Z",
        "2026-11-01T07:00:01.000Z",
    ]


# Daylight saving, southern hemisphere: Australia/Sydney, 2026.
# Fall back Sunday 5 April at 03:00 AEDT (16:00Z on the 4th) to 02:00 AEST;
# spring forward Sunday 4 October at 02:00 AEST (16:00Z on the 3rd) to 03:00 AEDT.


def test_sydney_spring_forward_skipped_time_fires_once_right_after_the_gap() -> None:
    assert walk("30 2 * * *", "Australia/Sydney", "2026-10-03T15:00:00Z", 2) == [
        "2026-10-03T16:00:00.000Z",  # 02:30 does not exist: 03:00 AEDT
        "2026-10-04T15:30:00.000Z",  # 02:30 AEDT on the 5th
    ]


def test_sydney_fall_back_repeated_time_fires_once() -> None:
    assert walk("30 2 * * *", "Australia/Sydney", "2026-04-04T14:00:00Z", 2) == [
        "2026-04-04T15:30:00.000Z",  # 02:30 AEDT, the first occurrence
        "2026-04-05T16:30:00.000Z",  # 02:30 AEST on the 6th, not the repeat
    ]


def test_half_hour_shift_lord_howe() -> None:
    # Lord Howe Island moves from +10:30 to +11:00 at 02:00 on 4 October 2026.
    assert walk("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T14:00:00Z", 2) == [
        "2026-10-03T15:30:00.000Z",  # 02:15 does not exist: 02:30 +11:00
        "2026-10-04T15:15:00.000Z",
    ]


_ZONES = st.sampled_from(["UTC", "America/New_York", "Australia/Sydney", "Europe/London", "Australia/Lord_Howe"])
_EXPRS = st.sampled_from(["*/15 * * * *", "30 1 * * *", "30 2 * * *", "0 * * * *", "*/20 * * * * *", "@daily"])


@settings(max_examples=300, deadline=None)
@given(
    expr=_EXPRS,
    tz=_ZONES,
    after=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(clock.UTC)),
)
def test_next_fire_is_later_and_nothing_fires_in_between(expr: str, tz: str, after: datetime) -> None:
    after = after.replace(microsecond=after.microsecond // 1000 * 1000)
    following = specs.next_fire(Cron(expr, tz), after)
    assert following is not None and following > after
    # Counting from any instant before it gives the same fire: none is skipped or doubled.
    assert specs.next_fire(Cron(expr, tz), following - timedelta(milliseconds=1)) == following
    middle = after + (following - after) / 2
    assert specs.next_fire(Cron(expr, tz), middle.replace(microsecond=middle.microsecond // 1000 * 1000)) == following
