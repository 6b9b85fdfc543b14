"""GET /checkpoint/witnessed on both servers: the newest checkpoint a quorum of witnesses cosigned,
as one signed note, and 404 until there is one. The cosignatures here are written as the collector
writes them, made with the witnesses' keys by hand (tests/transparency/test_witness.py: cosign)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries import witnesses as witness_queries
from agent_gateway.transparency import note, witness
from tests.transparency.test_routes import assert_error, publish
from tests.transparency.test_witness import cosign, vkey

pytestmark = pytest.mark.processes

# The Public routes use the same stand-in authentication scheme as /verify.
from tests.signatures.conftest import bearer  # noqa: E402,F401

KEYS = [ed25519.Ed25519PrivateKey.generate() for _ in range(3)]
NAMES = ["w1.example/w", "w2.example/w", "w3.example/w"]


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


VKEYS = [vkey(name, raw(key)) for name, key in zip(NAMES, KEYS)]


@pytest.fixture
def settings(settings: config.Settings) -> config.Settings:
    # Two witnesses of three cosign: the third is listed, unreachable (nothing collects here).
    witnesses = tuple(config.Witness(f"http://127.0.0.1:{port}", key) for port, key in zip((1, 2, 3), VKEYS))
    return dataclasses.replace(settings, witnesses=witnesses, witness_quorum=2)


async def store_cosignature(
    gateway: Gateway, index: int, text: bytes, name: str | None = None,
    cosignatures: witness_queries.Cosignatures = witness_queries.DECISIONS,
) -> None:
    """Witness ``index``'s cosignature of ``text``, kept as the collector keeps it (by default the Decision log's)."""
    line = cosign(text, name=name or NAMES[index], key=KEYS[index]).decode().rstrip("\n")
    size = note.Checkpoint.parse(text).size
    async with gateway.store.transaction() as conn:
        await cosignatures.add(conn, witness=VKEYS[index], tree_size=size, line=line)


async def current_text(client: httpx.AsyncClient, prefix: str = "", headers: dict[str, str] | None = None) -> bytes:
    """The text of the current checkpoint of the log under ``prefix`` (without its signature)."""
    signed = (await client.get(f"{prefix}/checkpoint", headers=headers)).content
    return signed[: signed.index(b"\n\n") + 1]


async def assert_witnessed_route(
    client: httpx.AsyncClient, headers: dict[str, str], gateway: Gateway, prefix: str,
    grow: Callable[[int], Awaitable[object]], cosignatures: witness_queries.Cosignatures,
) -> None:
    """GET {prefix}/checkpoint/witnessed of a log (``grow(n)`` appends n entries, ``cosignatures``
    holds its cosignatures): 404 until two of the three witnesses cosigned a size, then that
    checkpoint as one note with every cosignature of it, following the log as a quorum does."""
    route = f"{prefix}/checkpoint/witnessed"
    await assert_error(await client.get(route, headers=headers), 404)
    await grow(2)
    first = await current_text(client, prefix, headers)
    await store_cosignature(gateway, 0, first, cosignatures=cosignatures)
    await assert_error(await client.get(route, headers=headers), 404)  # one of two
    await store_cosignature(gateway, 1, first, cosignatures=cosignatures)
    response = await client.get(route, headers=headers)
    assert response.status_code == 200 and response.headers["content-type"] == "text/plain; charset=utf-8"
    [jwk] = gateway.identity.jwks()["keys"]
    origin = first.split(b"\n", 1)[0].decode()
    assert note.open_note(response.content, note.note_keys(origin, jwk)) == first
    _, _, lines = response.content.partition(b"\n\n")
    gateway_line, *cosigned = lines.decode().rstrip("\n").split("\n")
    assert gateway_line.startswith(f"\u2014 {origin} ") and len(cosigned) == 2
    for index in (0, 1):
        key = witness.WitnessKey.parse(VKEYS[index])
        assert witness.cosignature_of(key, first, (cosigned[index] + "\n").encode()) is not None
    # The log grows and one witness cosigns the new size: the witnessed checkpoint stays.
    await grow(2)
    second = await current_text(client, prefix, headers)
    await store_cosignature(gateway, 2, second, cosignatures=cosignatures)
    assert (await client.get(route, headers=headers)).content == response.content
    await store_cosignature(gateway, 0, second, cosignatures=cosignatures)
    newer = await client.get(route, headers=headers)
    assert note.open_note(newer.content, note.note_keys(origin, jwk)) == second
    assert newer.content.count("\u2014 ".encode()) == 3  # the gateway's, w1's and w3's
    # GET {prefix}/checkpoint is unchanged: the gateway's signature alone.
    assert (await client.get(f"{prefix}/checkpoint", headers=headers)).content.count("\u2014 ".encode()) == 1


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_404_until_a_quorum_cosigned_then_one_note_with_every_cosignature(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str], server: str
) -> None:
    client, headers = (agent, {}) if server == "agent" else (public, bearer)
    await assert_witnessed_route(
        client, headers, gateway, "", functools.partial(publish, agent), witness_queries.DECISIONS
    )


async def test_the_public_route_wants_the_bearer(public: httpx.AsyncClient) -> None:
    await assert_error(await public.get("/checkpoint/witnessed"), 401)


async def test_cosignatures_of_a_witness_no_longer_listed_do_not_count(
    agent: httpx.AsyncClient, gateway: Gateway, settings: config.Settings
) -> None:
    await publish(agent, 1)
    one = await current_text(agent)
    await store_cosignature(gateway, 0, one)
    async with gateway.store.transaction() as conn:
        await witness_queries.DECISIONS.add(conn, witness=vkey("gone.example/w", raw(KEYS[1])), tree_size=1, line="\u2014 gone x")
    await assert_error(await agent.get("/checkpoint/witnessed"), 404)


async def test_a_second_cosignature_of_a_size_by_one_witness_is_left_out(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    await publish(agent, 1)
    one = await current_text(agent)
    await store_cosignature(gateway, 0, one)
    await store_cosignature(gateway, 0, one)  # as after two leaders in turn: no error, no second row
    async with gateway.store.read() as conn:
        assert await witness_queries.DECISIONS.last_sizes(conn, VKEYS) == {VKEYS[0]: 1}
        assert await witness_queries.DECISIONS.witnessed(conn, VKEYS, 2) is None


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_the_witnesses_and_their_quorum_are_served(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, bearer: dict[str, str], server: str
) -> None:
    client, headers = (agent, {}) if server == "agent" else (public, bearer)
    response = await client.get("/checkpoint/witnesses", headers=headers)
    assert response.status_code == 200
    assert response.json() == {"quorum": 2, "witnesses": VKEYS}
    await assert_error(await client.get("/checkpoint/witnesses?x=1", headers=headers), 400)


async def test_the_public_witnesses_route_wants_the_bearer(public: httpx.AsyncClient) -> None:
    await assert_error(await public.get("/checkpoint/witnesses"), 401)


async def test_with_no_witnesses_the_quorum_is_zero(settings: config.Settings) -> None:
    gateway = Gateway(dataclasses.replace(settings, witnesses=(), witness_quorum=None))
    await gateway.start(migrate_first=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_asgi), base_url="http://agent") as agent:
            assert (await agent.get("/checkpoint/witnesses")).json() == {"quorum": 0, "witnesses": []}
    finally:
        await gateway.stop()
