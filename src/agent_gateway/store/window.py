"""Cursor windows over a numbered log (Decisions, Messages).

``after`` walks forwards from a number, ``before`` walks back from one, and
neither gives the newest page. Every page comes back ascending. Both cases
are one index range scan, so a read costs the same on a log of any length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agent_gateway.store import direct
from agent_gateway.store.engine import Store

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


class Queries:
    """The statements that read cursor windows of one log, each compiled once (see store.direct).

    ``select`` may hold bind parameters of its own (the User of a Message log);
    :meth:`rows` passes them on.
    """

    def __init__(self, select: sa.Select, seq: sa.ColumnElement[int]) -> None:
        cursor = sa.bindparam("cursor", type_=sa.Integer)
        limit = sa.bindparam("limit", type_=sa.Integer)
        self._after = direct.Query(select.where(seq > cursor).order_by(seq.asc()).limit(limit))
        self._before = direct.Query(select.where(seq < cursor).order_by(seq.desc()).limit(limit))
        self._newest = direct.Query(select.order_by(seq.desc()).limit(limit))

    async def rows(self, store: Store, window: Window, **params: Any) -> list[Sequence[Any]]:
        """The window's rows, ascending by number whichever direction was walked."""
        if window.after is not None:
            return list(await store.fetch(self._after, cursor=window.after, limit=window.limit, **params))
        if window.before is not None:
            rows = await store.fetch(self._before, cursor=window.before, limit=window.limit, **params)
        else:
            rows = await store.fetch(self._newest, limit=window.limit, **params)
        return list(rows)[::-1]
