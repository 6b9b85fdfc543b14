"""A Schedule's ``spec``: parsing it strictly, and the pure time math of when it fires.

Nothing here reads the clock or the database: :func:`next_fire` takes the
instant to count from, so every rule is testable with plain datetimes.

Cron expressions are croniter's: five fields, or six with seconds first; names
(``MON``, ``JAN``), steps, ranges, lists; and the macros ``@hourly``,
``@daily`` (``@midnight``), ``@weekly``, ``@monthly``, ``@yearly``
(``@annually``). They are matched against wall-clock time in the Schedule's
IANA zone. Daylight-saving transitions follow Vixie cron's rule for
fixed-time entries:

- a wall-clock time skipped by a spring-forward fires once, at the first
  instant after the gap (several skipped times collapse into that one fire);
- a wall-clock time repeated by a fall-back fires once, at its first
  occurrence; the repeated stretch fires nothing a second time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import zoneinfo
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import croniter

from agent_gateway import clock, errors

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
DEFAULT_TZ = "UTC"
# croniter expands a list item by item; a bound keeps a hostile expression cheap.
MAX_EXPR_CHARS = 1024
MACROS = frozenset({"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"})
# croniter's "R" (random) and "H" (hashed) items would expand differently each
# time the next occurrence is derived; no month or day name starts with either.
_RANDOM_ITEM = re.compile(r"(?:^|,)[RrHh]")


class InvalidSchedule(errors.InvalidInput):
    """The Schedule definition is invalid (spec: Errors 3; 400 over HTTP)."""


@dataclasses.dataclass(frozen=True)
class Once:
    """Fire once, at ``at``."""

    at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"kind": "once", "at": clock.format_instant(self.at)}


@dataclasses.dataclass(frozen=True)
class Cron:
    """Fire at every occurrence of ``expr`` in the zone ``tz``."""

    expr: str
    tz: str = DEFAULT_TZ

    def to_json(self) -> dict[str, Any]:
        return {"kind": "cron", "expr": self.expr, "tz": self.tz}


Spec = Once | Cron


def check_name(name: Any) -> str:
    """``name`` if it matches the Schedule name pattern; raises :class:`InvalidSchedule`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidSchedule("name must be 1 to 128 letters, digits, '.', '-' or '_'")
    return name


def parse_instant(what: str, value: Any) -> datetime:
    """An absolute ISO 8601 instant with an offset; raises :class:`InvalidSchedule`."""
    if not isinstance(value, str):
        raise InvalidSchedule(f"{what} must be a string")
    try:
        instant = clock.parse_instant(value)
    except (ValueError, OverflowError):
        raise InvalidSchedule(f"{what} must be an ISO 8601 instant with an offset (Z or ±hh:mm)") from None
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


@functools.cache
def _zones() -> frozenset[str]:
    # "localtime" is the host's zone, which the spec rules out as a default and as a value.
    return frozenset(zoneinfo.available_timezones() - {"localtime"})


def check_tz(tz: Any) -> str:
    """``tz`` if it names an IANA time zone; raises :class:`InvalidSchedule`."""
    if not isinstance(tz, str):
        raise InvalidSchedule("spec.tz must be a string")
    if tz not in _zones():
        raise InvalidSchedule(f"spec.tz: {tz[:64]!r} is not an IANA time zone")
    return tz


def check_expr(expr: Any) -> str:
    """``expr`` if croniter parses it as 5 or 6 fields or a macro; raises :class:`InvalidSchedule`."""
    if not isinstance(expr, str):
        raise InvalidSchedule("spec.expr must be a string")
    if len(expr) > MAX_EXPR_CHARS:
        raise InvalidSchedule(f"spec.expr is longer than {MAX_EXPR_CHARS} characters")
    fields = expr.split()
    if expr.lower() not in MACROS and len(fields) not in (5, 6):
        raise InvalidSchedule("spec.expr must have 5 fields, 6 with seconds first, or be an @-macro")
    if any(_RANDOM_ITEM.search(field) for field in fields):
        raise InvalidSchedule("spec.expr: random (R) and hashed (H) items are not supported")
    if not croniter.croniter.is_valid(expr, second_at_beginning=True):
        raise InvalidSchedule("spec.expr is not a valid cron expression")
    return expr


def from_json(value: Any) -> Spec:
    """The ``spec`` of a definition, strictly: known kinds and fields only, no coercion.

    Raises :class:`InvalidSchedule` for anything else (an unknown ``kind`` or
    field, a malformed ``at``, an unparsable ``expr``, an empty or unknown ``tz``).
    """
    if not isinstance(value, Mapping):
        raise InvalidSchedule("spec must be an object")
    kind = value.get("kind")
    fields = {"once": {"kind", "at"}, "cron": {"kind", "expr", "tz"}}.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise InvalidSchedule('spec.kind must be "once" or "cron"')
    unknown = sorted(set(value) - fields)
    if unknown:
        raise InvalidSchedule(f"spec: unknown field {unknown[0]!r} for kind {kind!r}")
    if kind == "once":
        if "at" not in value:
            raise InvalidSchedule("spec.at is required for kind 'once'")
        return Once(parse_instant("spec.at", value["at"]))
    if "expr" not in value:
        raise InvalidSchedule("spec.expr is required for kind 'cron'")
    return Cron(check_expr(value["expr"]), check_tz(value.get("tz", DEFAULT_TZ)))


def next_fire(spec: Spec, after: datetime) -> datetime | None:
    """When ``spec`` next fires counting from the instant ``after``; None if never.

    A once fires at its instant unless that is before ``after``. A cron fires
    at its first occurrence strictly after ``after``, with the daylight-saving
    rule of this module's docstring.
    """
    if isinstance(spec, Once):
        return spec.at if spec.at >= after else None
    zone = zoneinfo.ZoneInfo(spec.tz)
    local = after.astimezone(zone)
    wall = local.replace(tzinfo=None)
    if local.fold:
        # ``after`` is in the second pass of a repeated stretch, whose wall
        # times all fired on the first pass: count from the stretch's end.
        first_offset = local.replace(fold=0).utcoffset()
        assert first_offset is not None
        shift = first_offset - local.utcoffset()  # type: ignore[operator]
        end = _transition(zone, after - shift, after) + first_offset
        wall = end.replace(tzinfo=None) - timedelta(microseconds=1)
    try:
        occurrence = croniter.croniter(spec.expr, wall, second_at_beginning=True).get_next(datetime)
    except croniter.CroniterBadDateError:
        return None  # e.g. "0 0 30 2 *": no such day within croniter's search horizon
    return _instant(occurrence, zone)


def _instant(wall: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The instant a naive wall-clock time fires in ``zone`` (first occurrence; a gap's end)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(clock.UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(clock.UTC)
    if first <= second:
        return first  # unambiguous, or repeated (first occurrence)
    # In a gap, fold=0 reads the wall time with the offset from before the
    # transition and fold=1 with the one after, so the transition lies in
    # (second, first].
    return _transition(zone, second, first)


def _transition(zone: zoneinfo.ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The instant in (low, high] where ``zone``'s offset changes (there must be one).

    zoneinfo does not expose its transitions; they fall on whole seconds, so bisect for it.
    """
    low = low.replace(microsecond=0)
    before = low.astimezone(zone).utcoffset()
    lower, upper = 0, math.ceil((high - low).total_seconds())
    while upper - lower > 1:
        middle = (lower + upper) // 2
        if (low + timedelta(seconds=middle)).astimezone(zone).utcoffset() == before:
            lower = middle
        else:
            upper = middle
    return low + timedelta(seconds=upper)
