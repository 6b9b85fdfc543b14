"""The one source of "now".

Every timestamp the gateway writes comes from :func:`now`, formatted by
:func:`format_instant` as UTC ISO 8601 with milliseconds and ``Z``
(``2026-11-21T23:03:30.123Z``). That text is stored as-is, so it reads back
byte for byte and sorts in time order. Tests swap the source with
:func:`use` instead of sleeping.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

UTC = timezone.utc


def _system() -> datetime:
    return datetime.now(UTC)


_source: Callable[[], datetime] = _system


def now() -> datetime:
    """The current instant, UTC, truncated to whole milliseconds."""
    instant = _source()
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def now_iso() -> str:
    return format_instant(now())


def format_instant(instant: datetime) -> str:
    """Canonical text of an aware instant: ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    instant = instant.astimezone(UTC)
    # Not strftime: its %Y does not pad years before 1000, which breaks text order.
    return (
        f"{instant.year:04d}-{instant.month:02d}-{instant.day:02d}T"
        f"{instant.hour:02d}:{instant.minute:02d}:{instant.second:02d}.{instant.microsecond // 1000:03d}Z"
    )


# An instant must name its offset: a bare local time is ambiguous.
_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})", re.ASCII)


def parse_instant(text: str) -> datetime:
    """Parse an absolute ISO 8601 instant (offset required); raise ValueError otherwise."""
    if not isinstance(text, str) or not _INSTANT.fullmatch(text):
        raise ValueError("not an ISO 8601 instant with an offset (Z or ±hh:mm)")
    normalized = text.replace("z", "Z")
    fraction = re.search(r"\.(\d+)", normalized)
    if fraction and len(fraction.group(1)) > 6:
        # datetime keeps microseconds; finer digits are truncated, not refused.
        normalized = normalized.replace(fraction.group(0), "." + fraction.group(1)[:6], 1)
    instant = datetime.fromisoformat(normalized)  # raises ValueError for Feb 30 and the like
    try:
        return instant.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-01:00 is past the last representable UTC instant
        raise ValueError("instant out of range") from None


class FrozenClock:
    """A clock for tests: it stands still until told to move."""

    def __init__(self, start: datetime | str) -> None:
        self.instant = parse_instant(start) if isinstance(start, str) else start

    def __call__(self) -> datetime:
        return self.instant

    def advance(self, **delta: float) -> datetime:
        self.instant += timedelta(**delta)
        return self.instant

    def set(self, instant: datetime | str) -> None:
        self.instant = parse_instant(instant) if isinstance(instant, str) else instant


@contextlib.contextmanager
def use(source: Callable[[], datetime]) -> Iterator[Callable[[], datetime]]:
    """Make ``source`` the clock for the duration of the block."""
    global _source
    previous, _source = _source, source
    try:
        yield source
    finally:
        _source = previous
