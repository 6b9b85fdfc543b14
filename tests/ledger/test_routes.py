"""GET /ledger/checkpoint, /ledger/checkpoint/consistency, /ledger/entries and /ledger/entries/{seq}
on both servers (the Public server's behind the bearer)."""

from __future__ import annotations

import base64
import uuid

import httpx
import orjson

from agent_gateway import clock, merkle
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Signal
from agent_gateway.transparency import note
from tests.test_merkle import mth
from tests.transparency.test_routes import assert_error, checkpoint

ROUTES = ["/ledger/checkpoint", "/ledger/checkpoint/consistency?from=1", "/ledger/entries", "/ledger/entries/1"]


async def runs(gateway: Gateway, count: int) -> None:
    """``count`` Run entries, as the Signal Worker writes them."""
    signal = Signal("5d6f3c1e-0000-4000-8000-000000000001", "k", {"a": 1}, clock.now_iso(), "processing", None)
    for i in range(count):
        run = Run(str(uuid.uuid4()), signal.id, "s", f"p{i}", "running", None, None, None)
        async with gateway.store.transaction() as conn:
            await gateway.ledger.started(conn, signal, [run], clock.now_iso())


async def ledger_checkpoint(client: httpx.AsyncClient, gateway: Gateway, headers: dict[str, str] | None = None) -> note.Checkpoint:
    response = await client.get("/ledger/checkpoint", headers=headers)
    assert response.status_code == 200, response.text
    [jwk] = gateway.identity.jwks()["keys"]
    origin = response.text.split("\n", 1)[0]
    return note.Checkpoint.parse(note.open_note(response.content, note.note_keys(origin, jwk)))


async def test_entries_are_proved_in_the_signed_checkpoint_of_their_own_origin(
    agent: httpx.AsyncClient, gateway: Gateway
) -> None:
    first = await ledger_checkpoint(agent, gateway)
    assert first.size == 1  # the instructions at start
    decisions = await checkpoint(agent, gateway)
    assert first.origin.startswith("agent-gateway/ledger/")
    assert first.origin.removeprefix("agent-gateway/ledger/") == decisions.origin.removeprefix("agent-gateway/decisions/")
    await runs(gateway, 6)
    current = await ledger_checkpoint(agent, gateway)
    page = (await agent.get("/ledger/entries", params={"after": "0"})).json()["entries"]
    assert [(e["seq"], e["index"]) for e in page] == [(n, n - 1) for n in range(1, 8)]
    assert [e["kind"] for e in page] == ["instructions"] + ["run"] * 6
    leaves = [e["leaf"].encode() for e in page]
    assert current.size == 7 and current.root == mth(leaves)
    for entry in page:
        body = (await agent.get(f"/ledger/entries/{entry['seq']}")).json()
        assert {k: body[k] for k in entry} == entry and body["treeSize"] == 7
        proof = [base64.b64decode(h) for h in body["hashes"]]
        merkle.verify_inclusion(entry["index"], 7, merkle.leaf_hash(entry["leaf"].encode()), proof, current.root)
        assert orjson.loads(entry["leaf"])["type"] == entry["kind"]
    consistency = (await agent.get("/ledger/checkpoint/consistency", params={"from": "1"})).json()
    assert consistency["from"] == 1 and consistency["to"] == 7
    merkle.verify_consistency(1, 7, first.root, current.root, [base64.b64decode(h) for h in consistency["hashes"]])
    # A window: after and limit, as the other logs' reads.
    window = (await agent.get("/ledger/entries", params={"after": "2", "limit": "2"})).json()["entries"]
    assert [e["seq"] for e in window] == [3, 4]


async def test_the_public_server_answers_the_same_behind_the_bearer(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str]
) -> None:
    await runs(gateway, 2)
    for path in ROUTES:
        await assert_error(await public.get(path), 401)
        answer = await public.get(path, headers=bearer)
        assert answer.status_code == 200 and answer.content == (await agent.get(path)).content, path


BAD = [
    ("/ledger/entries/2", 404),
    ("/ledger/entries/0", 400),
    ("/ledger/entries/x", 400),
    ("/ledger/entries/01", 400),
    ("/ledger/entries?after=-1", 400),
    ("/ledger/entries?limit=201", 400),
    ("/ledger/entries?after=1&before=3", 400),
    ("/ledger/checkpoint/consistency", 400),
    ("/ledger/checkpoint/consistency?from=0", 400),
    ("/ledger/checkpoint/consistency?from=2", 400),
    ("/ledger/checkpoint/consistency?from=1&to=2", 400),
]


async def test_bad_input_is_refused_and_changes_nothing(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str]
) -> None:
    before = await agent.get("/ledger/checkpoint")
    for path, status in BAD:
        await assert_error(await agent.get(path), status)
        await assert_error(await public.get(path, headers=bearer), status)
    assert (await agent.get("/ledger/checkpoint")).content == before.content
