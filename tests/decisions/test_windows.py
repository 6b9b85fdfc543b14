"""Cursor-window properties of the Decision log (spec: Cursor-window reads), with hypothesis.

Walking forwards from ``after=0`` and backwards from the newest page, over a
log with any gaps and for any limit, reproduces the log exactly once, in order.
"""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_gateway.gateway import Gateway
from agent_gateway.store.tables import decisions

MAX_SEQ = 2**31 - 1
logs = st.lists(st.integers(1, MAX_SEQ), max_size=60, unique=True).map(sorted)
limits = st.one_of(st.integers(1, 7), st.integers(1, 200))


async def make_log(gateway: Gateway, numbers: list[int]) -> None:
    """A log holding exactly ``numbers`` (gaps are burned numbers); replaces any earlier one."""
    async with gateway.store.transaction() as conn:
        await conn.execute(decisions.delete())
        if numbers:
            rows = [{"seq": n, "statement": f"s{n}", "jws": f"j{n}", "created_at": "2026-01-01T00:00:00.000Z"} for n in numbers]
            await conn.execute(decisions.insert(), rows)


async def page(agent: httpx.AsyncClient, query: str) -> list[int]:
    response = await agent.get(f"/decisions?{query}")
    assert response.status_code == 200, response.text
    numbers = [decision["seq"] for decision in response.json()["decisions"]]
    assert numbers == sorted(numbers), "every page is ascending"
    return numbers


PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(numbers=logs, limit=limits)
async def test_walking_forwards_reproduces_the_log_exactly_once(agent: httpx.AsyncClient, gateway: Gateway, numbers: list[int], limit: int) -> None:
    await make_log(gateway, numbers)
    walked: list[int] = []
    after = 0
    while True:
        numbers_page = await page(agent, f"after={after}&limit={limit}")
        assert len(numbers_page) <= limit
        walked += numbers_page
        if len(numbers_page) < limit:  # a short page is the end, for now
            break
        after = numbers_page[-1]
    assert walked == numbers


@PROPERTY
@given(numbers=logs, limit=limits)
async def test_walking_backwards_reproduces_the_log_exactly_once(agent: httpx.AsyncClient, gateway: Gateway, numbers: list[int], limit: int) -> None:
    await make_log(gateway, numbers)
    pages: list[list[int]] = []
    query = f"limit={limit}"  # no cursor: the newest page
    while True:
        numbers_page = await page(agent, query)
        assert len(numbers_page) <= limit
        pages.insert(0, numbers_page)
        if len(numbers_page) < limit:
            break
        query = f"before={numbers_page[0]}&limit={limit}"
    assert [n for p in pages for n in p] == numbers


@PROPERTY
@given(numbers=logs, limit=limits, cursor=st.integers(0, MAX_SEQ))
async def test_every_window_is_the_slice_the_spec_describes(agent: httpx.AsyncClient, gateway: Gateway, numbers: list[int], limit: int, cursor: int) -> None:
    await make_log(gateway, numbers)
    assert await page(agent, f"limit={limit}") == numbers[-limit:]
    assert await page(agent, f"after={cursor}&limit={limit}") == [n for n in numbers if n > cursor][:limit]
    below = [n for n in numbers if n < cursor]
    assert await page(agent, f"before={cursor}&limit={limit}") == below[max(0, len(below) - limit):]
    if numbers and numbers[cursor % len(numbers)] < MAX_SEQ:
        seq = numbers[cursor % len(numbers)]
        one = (await agent.get(f"/decisions/{seq}")).json()
        assert (await agent.get(f"/decisions?before={seq + 1}&limit=1")).json() == {"decisions": [one]}
