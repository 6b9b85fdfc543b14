"""GET /ledger/checkpoint/witnessed on both servers, as GET /checkpoint/witnessed is the Decision
log's: the newest checkpoint of the Run ledger a quorum of witnesses cosigned, as one signed note,
and 404 until there is one. The cosignatures are written as the collector writes them, made with
the witnesses' keys by hand (tests/transparency/test_witnessed.py); the real witnesses are in
tests/ledger/test_witnessed_collector.py."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries import witnesses as witness_queries
from agent_gateway.transparency import note, witness
from tests.ledger.test_routes import runs
from tests.transparency.test_routes import assert_error
from tests.transparency.test_witness import cosign
from tests.transparency.test_witnessed import KEYS, NAMES, VKEYS, store_cosignature

pytestmark = pytest.mark.processes


@pytest.fixture
def settings(settings: config.Settings) -> config.Settings:
    # Two witnesses of three cosign: the third is listed, unreachable (nothing collects here).
    witnesses = tuple(config.Witness(f"http://127.0.0.1:{port}", key) for port, key in zip((1, 2, 3), VKEYS))
    return dataclasses.replace(settings, witnesses=witnesses, witness_quorum=2)


async def ledger_text(client: httpx.AsyncClient) -> bytes:
    """The text of the ledger's current checkpoint (without its signature)."""
    signed = (await client.get("/ledger/checkpoint")).content
    return signed[: signed.index(b"\n\n") + 1]


async def store_ledger_cosignature(gateway: Gateway, index: int, text: bytes) -> None:
    line = cosign(text, name=NAMES[index], key=KEYS[index]).decode().rstrip("\n")
    async with gateway.store.transaction() as conn:
        await witness_queries.LEDGER.add(conn, witness=VKEYS[index], tree_size=note.Checkpoint.parse(text).size, line=line)


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_404_until_a_quorum_cosigned_then_one_note_with_every_cosignature(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str], server: str
) -> None:
    client, headers = (agent, {}) if server == "agent" else (public, bearer)
    await assert_error(await client.get("/ledger/checkpoint/witnessed", headers=headers), 404)
    await runs(gateway, 2)
    three = await ledger_text(agent)
    assert note.Checkpoint.parse(three).size == 3  # the instructions and two Runs
    await store_ledger_cosignature(gateway, 0, three)
    await assert_error(await client.get("/ledger/checkpoint/witnessed", headers=headers), 404)  # one of two
    # The Decision log's cosignatures are not the ledger's, even of the same size.
    await store_cosignature(gateway, 1, three)
    await assert_error(await client.get("/ledger/checkpoint/witnessed", headers=headers), 404)
    await store_ledger_cosignature(gateway, 1, three)
    response = await client.get("/ledger/checkpoint/witnessed", headers=headers)
    assert response.status_code == 200 and response.headers["content-type"] == "text/plain; charset=utf-8"
    [jwk] = gateway.identity.jwks()["keys"]
    origin = three.split(b"\n", 1)[0].decode()
    assert origin.startswith("agent-gateway/ledger/")
    assert note.open_note(response.content, note.note_keys(origin, jwk)) == three
    _, _, lines = response.content.partition(b"\n\n")
    gateway_line, *cosignatures = lines.decode().rstrip("\n").split("\n")
    assert gateway_line.startswith(f"\u2014 {origin} ") and len(cosignatures) == 2
    for index in (0, 1):
        key = witness.WitnessKey.parse(VKEYS[index])
        assert witness.cosignature_of(key, three, (cosignatures[index] + "\n").encode()) is not None
    # The ledger grows and one witness cosigns the new size: the witnessed checkpoint stays at 3.
    await runs(gateway, 2)
    five = await ledger_text(agent)
    await store_ledger_cosignature(gateway, 2, five)
    assert (await client.get("/ledger/checkpoint/witnessed", headers=headers)).content == response.content
    await store_ledger_cosignature(gateway, 0, five)
    newer = await client.get("/ledger/checkpoint/witnessed", headers=headers)
    assert note.open_note(newer.content, note.note_keys(origin, jwk)) == five
    assert newer.content.count("\u2014 ".encode()) == 3  # the gateway's, w1's and w3's
    # GET /ledger/checkpoint is unchanged, and the Decision log's witnessed checkpoint is its own.
    assert (await client.get("/ledger/checkpoint", headers=headers)).content.count("\u2014 ".encode()) == 1
    await assert_error(await client.get("/checkpoint/witnessed", headers=headers), 404)


async def test_the_public_route_wants_the_bearer(public: httpx.AsyncClient) -> None:
    await assert_error(await public.get("/ledger/checkpoint/witnessed"), 401)


async def test_an_unknown_parameter_is_400(agent: httpx.AsyncClient) -> None:
    await assert_error(await agent.get("/ledger/checkpoint/witnessed?x=1"), 400)


async def test_with_no_witnesses_there_is_never_a_witnessed_ledger(settings: config.Settings) -> None:
    gateway = Gateway(dataclasses.replace(settings, witnesses=(), witness_quorum=None))
    await gateway.start(migrate_first=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_asgi), base_url="http://agent") as agent:
            await store_ledger_cosignature(gateway, 0, await ledger_text(agent))
            await assert_error(await agent.get("/ledger/checkpoint/witnessed"), 404)
    finally:
        await gateway.stop()
