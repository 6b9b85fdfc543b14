"""GET /checkpoint, GET /checkpoint/consistency and GET /decisions/{seq}/proof on both servers."""

from __future__ import annotations

import base64

import httpx
import pytest

from agent_gateway import merkle
from agent_gateway.gateway import Gateway
from agent_gateway.transparency import note
from tests.test_merkle import mth

pytestmark = pytest.mark.processes

ROUTES = ["/checkpoint", "/checkpoint/consistency?from=1", "/decisions/1/proof"]


async def publish(agent: httpx.AsyncClient, count: int) -> list[dict]:
    published = []
    for index in range(count):
        response = await agent.post("/decisions", json={"statement": f"d{index}"})
        assert response.status_code == 201, response.text
        published.append(response.json())
    return published


async def checkpoint(client: httpx.AsyncClient, gateway: Gateway, headers: dict[str, str] | None = None) -> note.Checkpoint:
    response = await client.get("/checkpoint", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    [jwk] = gateway.identity.jwks()["keys"]
    origin = response.text.split("\n", 1)[0]
    return note.Checkpoint.parse(note.open_note(response.content, note.note_keys(origin, jwk)))


async def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, (response.request.url, response.text)
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"statusCode", "error", "message"}


def unb64(hashes: list[str]) -> list[bytes]:
    return [base64.b64decode(hash_) for hash_ in hashes]


async def test_the_checkpoint_is_the_signed_root_of_the_log(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    empty = await checkpoint(agent, gateway)
    assert (empty.size, empty.root) == (0, merkle.EMPTY_ROOT)
    assert empty.origin.startswith("agent-gateway/decisions/")
    published = await publish(agent, 5)
    current = await checkpoint(agent, gateway)
    assert current.size == 5 and current.root == mth([d["jws"].encode() for d in published])
    assert current.origin == empty.origin
    # One size, one signed checkpoint: asking again answers the very same note.
    assert (await agent.get("/checkpoint")).content == (await agent.get("/checkpoint")).content


async def test_the_public_server_answers_the_same_behind_the_bearer(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str]
) -> None:
    await publish(agent, 3)
    for path in ROUTES:
        await assert_error(await public.get(path), 401)
        answer = await public.get(path, headers=bearer)
        assert answer.status_code == 200 and answer.content == (await agent.get(path)).content, path


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_inclusion_proofs_of_every_decision_in_every_size(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str], server: str
) -> None:
    client, headers = (agent, None) if server == "agent" else (public, bearer)
    published = await publish(agent, 7)
    leaves = [d["jws"].encode() for d in published]
    for index, decision in enumerate(published):
        response = await client.get(f"/decisions/{decision['seq']}/proof", headers=headers)
        assert response.status_code == 200
        body = response.json()
        assert list(body) == ["index", "treeSize", "hashes"] and body["index"] == index and body["treeSize"] == 7
        merkle.verify_inclusion(index, 7, merkle.leaf_hash(leaves[index]), unb64(body["hashes"]), mth(leaves))
        for size in range(index + 1, 8):
            body = (await client.get(f"/decisions/{decision['seq']}/proof?size={size}", headers=headers)).json()
            assert body["treeSize"] == size
            merkle.verify_inclusion(index, size, merkle.leaf_hash(leaves[index]), unb64(body["hashes"]), mth(leaves[:size]))


async def test_the_consistency_proof_between_any_two_sizes(agent: httpx.AsyncClient) -> None:
    leaves = [d["jws"].encode() for d in await publish(agent, 6)]
    for old in range(1, 7):
        for new in range(old, 7):
            response = await agent.get(f"/checkpoint/consistency?from={old}&to={new}")
            assert response.status_code == 200
            body = response.json()
            assert list(body) == ["from", "to", "hashes"] and (body["from"], body["to"]) == (old, new)
            assert (body["hashes"] == []) == (old == new)
            merkle.verify_consistency(old, new, mth(leaves[:old]), mth(leaves[:new]), unb64(body["hashes"]))
    assert (await agent.get("/checkpoint/consistency?from=2")).json()["to"] == 6


async def test_bad_proof_requests_are_400_or_404_with_json_bodies(agent: httpx.AsyncClient) -> None:
    published = await publish(agent, 3)
    third = published[2]["seq"]
    for path in [
        f"/decisions/{third}/proof?size=2",  # smaller than index + 1
        f"/decisions/{third}/proof?size=4",  # beyond the tree
        f"/decisions/{third}/proof?size=0",
        f"/decisions/{third}/proof?size=x",
        f"/decisions/{third}/proof?size=01",
        f"/decisions/{third}/proof?size=3&size=3",
        f"/decisions/{third}/proof?other=1",
        "/decisions/0/proof",
        "/decisions/abc/proof",
        "/checkpoint/consistency",
        "/checkpoint/consistency?from=0&to=2",
        "/checkpoint/consistency?from=3&to=2",
        "/checkpoint/consistency?from=1&to=4",
        "/checkpoint/consistency?from=1&to=2&other=1",
        "/checkpoint/consistency?from=1&from=1",
        "/checkpoint/consistency?from=-1",
        "/checkpoint?size=1",
        "/checkpoint?x",
    ]:
        await assert_error(await agent.get(path), 400)
    await assert_error(await agent.get("/decisions/4/proof"), 404)
    await assert_error(await agent.get("/decisions/2147483647/proof?size=1"), 404)
    await assert_error(await agent.post("/checkpoint"), 405)
    # The spec's route next door keeps its behaviour.
    assert (await agent.get(f"/decisions/{third}")).json() == published[2]
    await assert_error(await agent.get(f"/decisions/{third}?size=1"), 400)


async def test_the_routes_are_in_both_openapi_documents(agent: httpx.AsyncClient, public: httpx.AsyncClient) -> None:
    for client in (agent, public):
        paths = (await client.get("/openapi.json")).json()["paths"]
        assert {"/checkpoint", "/checkpoint/consistency", "/decisions/{seq}/proof"} <= set(paths)
        parameters = {p["name"] for p in paths["/checkpoint/consistency"]["get"]["parameters"] if p["in"] == "query"}
        assert parameters == {"from", "to"}
        assert "text/plain" in paths["/checkpoint"]["get"]["responses"]["200"]["content"]
