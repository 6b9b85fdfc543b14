"""Query and path parameters shared by many routes, parsed exactly.

Integers are canonical decimal only: ``1.0``, ``+1``, `` 1``, ``01`` and
``1e3`` are 400, as is anything out of range. FastAPI sees every parameter as
an optional string so that all refusals come from here with one wording.
Dependencies are ``async def``: FastAPI runs a plain ``def`` in its thread
pool, which costs a thread hop on every request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from agent_gateway import errors
from agent_gateway.http.routing import INT32_MAX, parse_int
from agent_gateway.store import window as windows

LimitQuery = Annotated[
    str | None,
    Query(description=f"page size, 1..{windows.MAX_LIMIT} (default {windows.DEFAULT_LIMIT})", examples=["50"]),
]
CursorQuery = Annotated[str | None, Query(description=f"sequence number, 0..{windows.MAX_CURSOR}")]


async def list_limit(limit: LimitQuery = None) -> int:
    """The ``limit`` of a list read: 1..200, default 50; above 200 is refused, not reduced."""
    return _limit(limit)


def _limit(limit: str | None) -> int:
    value = parse_int("limit", limit, 1, windows.MAX_LIMIT)
    return windows.DEFAULT_LIMIT if value is None else value


def plain_limit(query: dict[str, str], *, also: frozenset[str]) -> int | None:
    """The ``limit`` of a fast-path list read (``http.fastpath``); None when it is not plainly valid.

    ``also`` names the route's other parameters, which the caller reads itself.
    """
    if not query.keys() <= {"limit"} | also:
        return None
    try:
        return _limit(query.get("limit"))
    except errors.InvalidInput:
        return None


async def cursor_window(after: CursorQuery = None, before: CursorQuery = None, limit: LimitQuery = None) -> windows.Window:
    """The cursor window of a log read (spec: Cursor-window reads, rules 1-8)."""
    return _window(after, before, limit)


_WINDOW_PARAMETERS = frozenset({"after", "before", "limit"})


def _window(after: str | None, before: str | None, limit: str | None) -> windows.Window:
    after_value = parse_int("after", after, 0, windows.MAX_CURSOR)
    before_value = parse_int("before", before, 0, windows.MAX_CURSOR)
    if after_value is not None and before_value is not None:
        raise errors.InvalidInput("after and before cannot be combined")
    limit_value = parse_int("limit", limit, 1, windows.MAX_LIMIT)
    return windows.Window(after_value, before_value, windows.DEFAULT_LIMIT if limit_value is None else limit_value)


def plain_window(query: dict[str, str], *, also: frozenset[str] = frozenset()) -> windows.Window | None:
    """The cursor window of a fast-path read (``http.fastpath``); None when it is not plainly valid.

    ``also`` names the route's other parameters, which the caller reads itself.
    """
    if not query.keys() <= _WINDOW_PARAMETERS | also:
        return None
    try:
        return _window(query.get("after"), query.get("before"), query.get("limit"))
    except errors.InvalidInput:
        return None


def seq_path(seq: str) -> int:
    value = parse_int("seq", seq, 1, INT32_MAX)
    assert value is not None
    return value
