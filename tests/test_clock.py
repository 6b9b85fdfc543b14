"""The one source of time: canonical format, instant parsing, FrozenClock, ``use`` (clock.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agent_gateway import clock

CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


def test_now_is_utc_whole_milliseconds() -> None:
    instant = clock.now()
    assert instant.tzinfo is not None and instant.utcoffset() == timedelta(0)
    assert instant.microsecond % 1000 == 0
    assert CANONICAL.fullmatch(clock.now_iso())


@pytest.mark.parametrize(
    ("instant", "text"),
    [
        (datetime(2026, 11, 21, 23, 3, 30, 123456, UTC), "2026-11-21T23:03:30.123Z"),
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000Z"),
        (datetime(2026, 1, 1, 0, 30, 0, 999999, timezone(timedelta(hours=1))), "2025-12-31T23:30:00.999Z"),
        (datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))), "2026-06-01T17:30:00.000Z"),
        (datetime(999, 1, 1, tzinfo=UTC), "0999-01-01T00:00:00.000Z"),
        (datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000Z"),
    ],
)
def test_format_instant_is_canonical(instant: datetime, text: str) -> None:
    assert clock.format_instant(instant) == text
    assert CANONICAL.fullmatch(text)


def test_canonical_text_sorts_in_time_order() -> None:
    instants = [datetime(year, 1, 1, tzinfo=UTC) for year in (5, 999, 1000, 2026)]
    texts = [clock.format_instant(instant) for instant in instants]
    assert sorted(texts) == texts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T23:03:30.123Z", datetime(2026, 11, 21, 23, 3, 30, 123000, UTC)),
        ("2026-11-21T23:03:30Z", datetime(2026, 11, 21, 23, 3, 30, tzinfo=UTC)),
        ("2026-11-21T23:03Z", datetime(2026, 11, 21, 23, 3, tzinfo=UTC)),
        ("2026-11-21t23:03:30z", datetime(2026, 11, 21, 23, 3, 30, tzinfo=UTC)),
        ("2026-11-21T23:03:30+00:00", datetime(2026, 11, 21, 23, 3, 30, tzinfo=UTC)),
        ("2026-11-22T01:03:30+02:00", datetime(2026, 11, 21, 23, 3, 30, tzinfo=UTC)),
        ("2026-11-21T18:33:30-04:30", datetime(2026, 11, 21, 23, 3, 30, tzinfo=UTC)),
        ("2026-11-21T23:03:30.5Z", datetime(2026, 11, 21, 23, 3, 30, 500000, UTC)),
        ("2026-11-21T23:03:30.123456Z", datetime(2026, 11, 21, 23, 3, 30, 123456, UTC)),
        # Finer than microseconds is truncated, never rounded into the next second.
        ("2026-11-21T23:03:30.999999999Z", datetime(2026, 11, 21, 23, 3, 30, 999999, UTC)),
        ("2024-02-29T00:00:00Z", datetime(2024, 2, 29, tzinfo=UTC)),
    ],
)
def test_parse_instant(text: str, expected: datetime) -> None:
    parsed = clock.parse_instant(text)
    assert parsed == expected
    assert parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-21T23:03:30",  # no offset: a local time is ambiguous
        "2026-11-21T23:03:30.123",
        "2026-11-21",
        "2026-02-30T00:00:00Z",  # no such day
        "2025-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-11-21T24:00:00Z",
        "2026-11-21T23:60:00Z",
        "2026-11-21T23:03:30+25:00",
        "2026-11-21T23:03:30.Z",
        "2026-11-21T23:03:30.1234567890Z",
        "2026-11-21T23:03:30 Z",
        " 2026-11-21T23:03:30Z",
        "2026-11-21T23:03:30Z ",
        "20261121T230330Z",
        "1700000000",
        "",
        "now",
        "２０２６-11-21T23:03:30Z",  # full-width digits are not ASCII digits
        "2026-11-21T23:03:30\x00Z",
        # Valid text whose instant in UTC falls outside what a datetime can hold.
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00+01:00",
    ],
)
def test_parse_instant_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        clock.parse_instant(text)


@pytest.mark.parametrize("value", [None, 1700000000, b"2026-11-21T23:03:30Z", ["2026-11-21T23:03:30Z"]])
def test_parse_instant_refuses_non_strings(value: object) -> None:
    with pytest.raises(ValueError):
        clock.parse_instant(value)  # type: ignore[arg-type]


def test_parse_round_trips_canonical_text() -> None:
    text = "2026-11-21T23:03:30.123Z"
    assert clock.format_instant(clock.parse_instant(text)) == text


def test_frozen_clock_stands_still_until_moved() -> None:
    frozen = clock.FrozenClock("2026-03-29T00:59:59.999+00:00")
    with clock.use(frozen) as source:
        assert source is frozen
        assert clock.now_iso() == "2026-03-29T00:59:59.999Z"
        assert clock.now_iso() == "2026-03-29T00:59:59.999Z"
        assert clock.format_instant(frozen.advance(milliseconds=1)) == "2026-03-29T01:00:00.000Z"
        assert clock.now_iso() == "2026-03-29T01:00:00.000Z"
        frozen.advance(days=1, hours=2)
        assert clock.now_iso() == "2026-03-30T03:00:00.000Z"
        frozen.set("2030-01-01T00:00:00Z")
        assert clock.now_iso() == "2030-01-01T00:00:00.000Z"
        frozen.set(datetime(2031, 1, 1, tzinfo=UTC))
        assert clock.now() == datetime(2031, 1, 1, tzinfo=UTC)


def test_now_truncates_a_source_finer_than_milliseconds() -> None:
    with clock.use(clock.FrozenClock(datetime(2026, 1, 1, 0, 0, 0, 999999, UTC))):
        assert clock.now().microsecond == 999000
        assert clock.now_iso() == "2026-01-01T00:00:00.999Z"


def test_use_restores_the_previous_source_even_on_error() -> None:
    outer = clock.FrozenClock("2026-01-01T00:00:00Z")
    inner = clock.FrozenClock("2027-01-01T00:00:00Z")
    with clock.use(outer):
        with pytest.raises(RuntimeError), clock.use(inner):
            assert clock.now_iso() == "2027-01-01T00:00:00.000Z"
            raise RuntimeError
        assert clock.now_iso() == "2026-01-01T00:00:00.000Z"
    # Back on the system clock.
    assert abs(clock.now() - datetime.now(UTC)) < timedelta(days=1)
