"""Concurrent writers of one User's log: seqs stay exactly 1..k; a lost race is 503 and stores nothing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.gateway import Gateway
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import messages as queries

from tests import served
from tests.messages.records import assert_error, bearer, stored_messages, stored_signals, waiting_on_a_lock

pytestmark = pytest.mark.processes

WRITERS = 40

# Makes every INSERT into messages collide on (user_id, seq): a row with the same
# key is slipped in just before it, inside the same statement, so the write
# fails exactly as a lost race does and its statement's effects roll back.
_COLLIDE = {
    "sqlite": [
        """
        CREATE TRIGGER collide BEFORE INSERT ON messages WHEN NEW.text <> 'intruder'
        BEGIN
            INSERT INTO messages (user_id, seq, id, direction, text, created_at)
            VALUES (NEW.user_id, NEW.seq, lower(hex(randomblob(16))), 'outbound', 'intruder', NEW.created_at);
        END
        """,
    ],
    "postgresql": [
        """
        CREATE FUNCTION collide() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF pg_trigger_depth() = 1 THEN
                INSERT INTO messages (user_id, seq, id, direction, text, created_at)
                VALUES (NEW.user_id, NEW.seq, gen_random_uuid()::text, 'outbound', 'intruder', NEW.created_at);
            END IF;
            RETURN NEW;
        END $$
        """,
        "CREATE TRIGGER collide BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION collide()",
    ],
}


async def make_every_write_collide(store: Store) -> None:
    async with store.transaction() as conn:
        for statement in _COLLIDE[store.dialect]:
            await conn.execute(sa.text(statement))


async def test_a_collision_on_seq_answers_503_and_stores_nothing(
    public: httpx.AsyncClient, agent: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    user_id = await admit()
    await make_every_write_collide(authenticating.store)
    inbound = await public.post("/messages", json={"text": "hello"}, headers=bearer(user_id))
    outbound = await agent.post("/messages", json={"userId": user_id, "text": "hi"})
    for response in (inbound, outbound):
        assert_error(response, 503)
        assert "retry" in response.json()["message"] or "resend" in response.json()["message"]
    assert await stored_messages(authenticating.store) == []
    assert await stored_signals(authenticating.store) == []


# PostgreSQL only: SQLite serialises writers at BEGIN IMMEDIATE, so two cannot interleave.
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_users_writers_queue_on_the_user_row_on_postgresql(
    agent: httpx.AsyncClient, gateway: Gateway, admit
) -> None:
    """A request waits for a transaction holding an uncommitted Message, then numbers after it.

    The other transaction skips the service (no User lock) and holds seq 1.
    Without the request's lock on the User's row it would compute seq 1 too and
    lose the race (503, as the store test shows); with it, it waits and gets 2.
    """
    user_id = await admit()
    async with gateway.store.transaction() as first:
        won = await queries.append(
            first, id=str(uuid.uuid4()), user_id=user_id, direction="outbound", text="first",
            created_at=clock.now_iso(),
        )
        request = asyncio.create_task(agent.post("/messages", json={"userId": user_id, "text": "second"}))
        await waiting_on_a_lock(gateway.store)
    response = await request
    assert response.status_code == 201, response.text
    assert response.json()["seq"] == won.seq + 1
    assert [(row["seq"], row["text"]) for row in await stored_messages(gateway.store)] == [(1, "first"), (2, "second")]


def assert_numbered_1_to_k(statuses: list[int], created: list[dict], log: list[dict]) -> None:
    """Every answer 201 or 503; the stored log is exactly the 201s, numbered 1..k."""
    assert set(statuses) <= {201, 503}, Counter(statuses)
    assert [m["seq"] for m in log] == list(range(1, len(log) + 1))
    assert sorted(created, key=lambda m: m["seq"]) == log


async def test_concurrent_writers_of_one_user(
    public: httpx.AsyncClient, agent: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    """Inbound and outbound writers at once, each request on its own database connection."""
    user_id, bystander = await admit(), await admit()

    async def write(n: int) -> httpx.Response:
        if n % 2:
            return await public.post("/messages", json={"text": f"in {n}"}, headers=bearer(user_id))
        return await agent.post("/messages", json={"userId": user_id, "text": f"out {n}"})

    async def disturb(n: int) -> httpx.Response:
        return await agent.post("/messages", json={"userId": bystander, "text": f"other {n}"})

    responses = await asyncio.gather(*(write(n) for n in range(WRITERS)), *(disturb(n) for n in range(5)))
    mine = responses[:WRITERS]
    created = [r.json() for r in mine if r.status_code == 201]
    log = (await agent.get("/messages", params={"user": user_id, "limit": "200"})).json()["messages"]
    assert_numbered_1_to_k([r.status_code for r in mine], created, log)
    inbound = [m for m in log if m["direction"] == "inbound"]
    assert sorted((s["payload"] for s in await stored_signals(authenticating.store)), key=lambda m: m["seq"]) == inbound
    other = (await agent.get("/messages", params={"user": bystander})).json()["messages"]
    assert [m["seq"] for m in other] == [1, 2, 3, 4, 5]


@pytest.mark.e2e
async def test_concurrent_writers_from_two_gateway_processes(tmp_path: Path, database_url: str) -> None:
    """Two processes write one User's log over many connections.

    On PostgreSQL they are two ``serve`` processes; a SQLite file takes one ``serve``,
    so there it is one ``serve`` with two HTTP processes sharing its address.
    """
    with contextlib.ExitStack() as stack:
        if database_url.startswith("sqlite"):
            workers = {"AGENT_GATEWAY_HTTP_WORKERS": "2"}
            one = two = stack.enter_context(served.ServedGateway.start(tmp_path / "one", database_url, workers))
        else:
            one = stack.enter_context(served.ServedGateway.start(tmp_path / "one", database_url))
            two = stack.enter_context(served.ServedGateway.start(tmp_path / "two", database_url))
        user_id = one.cli_json("users", "add")["id"]
        limits = httpx.Limits(max_connections=WRITERS)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:

            async def write(n: int) -> httpx.Response:
                base = (one, two)[n % 2].agent_url
                return await client.post(f"{base}/messages", json={"userId": user_id, "text": f"m{n}"})

            responses = await asyncio.gather(*(write(n) for n in range(WRITERS)))
            read = await client.get(f"{two.agent_url}/messages", params={"user": user_id, "limit": "200"})
    created = [r.json() for r in responses if r.status_code == 201]
    assert_numbered_1_to_k([r.status_code for r in responses], created, read.json()["messages"])
    assert len(created) > WRITERS // 2  # the 503 is a rare safety net, not the norm
