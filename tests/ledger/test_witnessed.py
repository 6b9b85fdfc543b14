"""GET /ledger/checkpoint/witnessed on both servers, as GET /checkpoint/witnessed is the Decision
log's (tests/transparency/test_witnessed.py, whose checks these are): the newest checkpoint of the
Run ledger a quorum of witnesses cosigned, as one signed note, and 404 until there is one. The
real witnesses are in tests/transparency/test_collector.py."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries import witnesses as witness_queries
from tests.ledger.test_routes import runs
from tests.transparency.test_routes import assert_error
from tests.transparency.test_witnessed import assert_witnessed_route, current_text, store_cosignature

pytestmark = pytest.mark.processes

from tests.transparency.test_witnessed import settings  # noqa: E402,F401 (three witnesses, a quorum of two)


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_404_until_a_quorum_cosigned_then_one_note_with_every_cosignature(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str], server: str
) -> None:
    client, headers = (agent, {}) if server == "agent" else (public, bearer)

    async def grow(count: int) -> None:
        await runs(gateway, count)

    await assert_witnessed_route(client, headers, gateway, "/ledger", grow, witness_queries.LEDGER)
    # The Decision log's witnessed checkpoint is its own: none here.
    await assert_error(await client.get("/checkpoint/witnessed", headers=headers), 404)


async def test_the_decision_logs_cosignatures_are_not_the_ledgers(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    text = await current_text(agent, "/ledger")
    for index in (0, 1):  # a quorum, of the Decision log's tree of the same size
        await store_cosignature(gateway, index, text)
    await assert_error(await agent.get("/ledger/checkpoint/witnessed"), 404)


async def test_the_public_route_wants_the_bearer(public: httpx.AsyncClient) -> None:
    await assert_error(await public.get("/ledger/checkpoint/witnessed"), 401)


async def test_an_unknown_parameter_is_400(agent: httpx.AsyncClient) -> None:
    await assert_error(await agent.get("/ledger/checkpoint/witnessed?x=1"), 400)


async def test_with_no_witnesses_there_is_never_a_witnessed_ledger(settings: config.Settings) -> None:  # noqa: F811
    gateway = Gateway(dataclasses.replace(settings, witnesses=(), witness_quorum=None))
    await gateway.start(migrate_first=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_asgi), base_url="http://agent") as agent:
            await store_cosignature(gateway, 0, await current_text(agent, "/ledger"), cosignatures=witness_queries.LEDGER)
            await assert_error(await agent.get("/ledger/checkpoint/witnessed"), 404)
    finally:
        await gateway.stop()
