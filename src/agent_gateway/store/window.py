"""Cursor windows over a numbered log (Decisions, Messages).

``after`` walks forwards from a number, ``before`` walks back from one, and
neither gives the newest page. Every page comes back ascending. Both cases
are one index range scan, so a read costs the same on a log of any length.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_CURSOR = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Window:
    after: int | None = None
    before: int | None = None
    limit: int = DEFAULT_LIMIT

    def __post_init__(self) -> None:
        if self.after is not None and self.before is not None:
            raise ValueError("after and before cannot be combined")


def apply(query: sa.Select, seq: sa.ColumnElement[int], window: Window) -> sa.Select:
    """Restrict ``query`` to the window; the rows come back in :func:`ascending` order after."""
    if window.after is not None:
        return query.where(seq > window.after).order_by(seq.asc()).limit(window.limit)
    if window.before is not None:
        query = query.where(seq < window.before)
    return query.order_by(seq.desc()).limit(window.limit)


def ascending(rows: list, window: Window) -> list:
    """Rows of :func:`apply`, ascending by number whichever direction was walked."""
    return rows if window.after is not None else rows[::-1]
