"""Cursor windows over a numbered log (store/window.py), on the decisions table of both backends."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.store import tables, window
from agent_gateway.store.engine import Store
from agent_gateway.store.window import Window

decisions = tables.decisions


@pytest.fixture
async def log(store: Store) -> Store:
    """Decisions 1..12 with 4, 5 and 9 burnt (gaps mean nothing)."""
    async with store.transaction() as conn:
        for n in range(1, 13):
            await conn.execute(decisions.insert().values(statement=f"s{n}", jws="x.y.z", created_at=clock.now_iso()))
        await conn.execute(decisions.delete().where(decisions.c.seq.in_([4, 5, 9])))
    return store


WINDOWS = window.Queries(sa.select(decisions.c.seq, decisions.c.statement), decisions.c.seq)


async def read(store: Store, **cursor: int) -> list[int]:
    rows = await WINDOWS.rows(store, Window(**cursor))
    seqs = [row[0] for row in rows]
    # Straight from the driver: the statement column is its JSON text.
    assert [row[1] for row in rows] == [f'"s{n}"' for n in seqs]
    return seqs


CASES = [
    # (cursor, the seqs it reads). No cursor: the newest page.
    ({}, [1, 2, 3, 6, 7, 8, 10, 11, 12]),
    ({"limit": 3}, [10, 11, 12]),
    ({"limit": 1}, [12]),
    # before=N: the newest page strictly below N.
    ({"before": 10, "limit": 3}, [6, 7, 8]),
    ({"before": 9, "limit": 2}, [7, 8]),
    ({"before": 4, "limit": 50}, [1, 2, 3]),
    ({"before": 1}, []),
    ({"before": 0}, []),
    ({"before": 2**31 - 1, "limit": 2}, [11, 12]),
    # after=N: strictly above N, walking forwards; after=0 from the beginning.
    ({"after": 0, "limit": 3}, [1, 2, 3]),
    ({"after": 0}, [1, 2, 3, 6, 7, 8, 10, 11, 12]),
    ({"after": 3, "limit": 2}, [6, 7]),
    ({"after": 8, "limit": 50}, [10, 11, 12]),
    ({"after": 12}, []),
    ({"after": 2**31 - 1}, []),
]


async def test_window(log: Store) -> None:
    # One log for every case: each test database costs a CREATE DATABASE on PostgreSQL.
    for cursor, expected in CASES:
        assert await read(log, **cursor) == expected, cursor


async def test_walking_forwards_and_back_visits_every_record_once(log: Store) -> None:
    forwards: list[int] = []
    after = 0
    while page := await read(log, after=after, limit=2):
        assert page == sorted(page)
        forwards += page
        after = page[-1]
    backwards: list[int] = []
    page = await read(log, limit=2)
    while page:
        backwards = page + backwards
        page = await read(log, before=page[0], limit=2)
    assert forwards == backwards == [1, 2, 3, 6, 7, 8, 10, 11, 12]


async def test_an_empty_log(store: Store) -> None:
    assert await read(store) == []
    assert await read(store, after=0) == []
    assert await read(store, before=5) == []


def test_after_and_before_cannot_be_combined() -> None:
    with pytest.raises(ValueError):
        Window(after=1, before=2)
    assert Window() == Window(None, None, window.DEFAULT_LIMIT)
    assert (window.DEFAULT_LIMIT, window.MAX_LIMIT, window.MAX_CURSOR) == (50, 200, 2**31 - 1)
