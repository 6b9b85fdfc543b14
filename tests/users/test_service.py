"""Users: the operator-side API (users/service.py) and the Agent server's read routes (users/routes.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import clock, errors
from agent_gateway.gateway import Gateway
from agent_gateway.store import tables
from agent_gateway.store.engine import Store
from agent_gateway.users import service

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")

# Every kind of JSON value an operator may set; each must read back exactly
# (type, value and key order), through the service and over HTTP.
ATTRIBUTES: list[Any] = [
    {"zeta": 1, "alpha": {"y": [], "b": None}, "mid": "x"},
    [1, "two", 3.5, True, None, {}, []],
    "a string",
    "",
    0,
    -1,
    3.25,
    -0.0,
    1e-7,
    1.7976931348623157e308,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    10**30,
    -(10**30),
    {"big": [10**40, -(2**64)], "float": 0.1},
    True,
    False,
    None,
    {},
    [],
    {"ключ": "値 🎉", "emoji 👩‍💻": ["ñ", "\u2028", "tab\tnew\nline", "nul \u0000 inside", 'quote " back \\']},
]


def exactly(value: Any) -> str:
    """A text that differs for any difference of type, value or key order (1 vs 1.0, -0.0 vs 0.0)."""
    return repr(value)


def strip_instant(user: dict[str, Any]) -> None:
    assert CANONICAL.fullmatch(user["createdAt"])


async def admit(store: Store) -> service.User:
    async with store.transaction() as conn:
        return await service.admit(conn)


async def signal_count(store: Store) -> int:
    async with store.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(tables.signals))).scalar_one()


async def test_admit(store: Store) -> None:
    with clock.use(clock.FrozenClock("2026-11-21T23:03:30.123Z")):
        first = await admit(store)
        second = await admit(store)
    assert UUID.fullmatch(first.id) and UUID.fullmatch(second.id)
    assert first.id[14] == "4"  # a random (version 4) UUID
    assert first.id != second.id
    assert first.attributes == {} and first.created_at == "2026-11-21T23:03:30.123Z"
    assert first.to_json() == {"id": first.id, "attributes": {}, "createdAt": "2026-11-21T23:03:30.123Z"}
    async with store.read() as conn:
        assert await service.get(conn, first.id) == first
    assert await signal_count(store) == 0


async def test_admit_in_a_rolled_back_transaction_leaves_no_user(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            user = await service.admit(conn)
            raise RuntimeError
    async with store.read() as conn:
        with pytest.raises(service.UserNotFound):
            await service.get(conn, user.id)


async def test_set_attributes_round_trips_every_json_kind(store: Store, agent: httpx.AsyncClient) -> None:
    user = await admit(store)
    for value in ATTRIBUTES:
        async with store.transaction() as conn:
            written = await service.set_attributes(conn, user.id, value)
        assert exactly(written.attributes) == exactly(value)
        assert (written.id, written.created_at) == (user.id, user.created_at)
        async with store.read() as conn:
            assert exactly((await service.get(conn, user.id)).attributes) == exactly(value)
        response = await agent.get(f"/users/{user.id}")
        assert response.status_code == 200
        # The standard library keeps big integers exact, so it judges the wire text.
        body = json.loads(response.text)
        assert list(body) == ["id", "attributes", "createdAt"]
        assert exactly(body["attributes"]) == exactly(value), value
    assert await signal_count(store) == 0


async def test_set_attributes_replaces_wholesale(store: Store) -> None:
    user = await admit(store)
    async with store.transaction() as conn:
        await service.set_attributes(conn, user.id, {"a": 1, "b": 2})
        assert (await service.set_attributes(conn, user.id, {"c": 3})).attributes == {"c": 3}
    async with store.read() as conn:
        assert (await service.get(conn, user.id)).attributes == {"c": 3}


async def test_set_attributes_of_nobody(store: Store) -> None:
    async with store.transaction() as conn:
        with pytest.raises(service.UserNotFound) as caught:
            await service.set_attributes(conn, "3f2504e0-4f89-41d3-9a0c-0305e82c3301", {"a": 1})
    assert isinstance(caught.value, errors.NotFound)
    async with store.read() as conn:
        assert await service.list_newest(conn, 50) == []


async def test_get_nobody(store: Store) -> None:
    async with store.read() as conn:
        with pytest.raises(service.UserNotFound):
            await service.get(conn, "3f2504e0-4f89-41d3-9a0c-0305e82c3301")


async def test_list_users_newest_first(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    frozen = clock.FrozenClock("2026-01-01T00:00:00Z")
    admitted = []
    with clock.use(frozen):
        for _ in range(3):
            admitted.append((await admit(gateway.store)).to_json())
            frozen.advance(milliseconds=1)
    response = await agent.get("/users")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["users"]
    assert body["users"] == admitted[::-1]
    for user in body["users"]:
        assert list(user) == ["id", "attributes", "createdAt"]


async def test_list_users_on_an_empty_store(agent: httpx.AsyncClient) -> None:
    response = await agent.get("/users")
    assert response.status_code == 200 and response.json() == {"users": []}


async def test_list_users_limit(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    frozen = clock.FrozenClock("2026-01-01T00:00:00Z")
    with clock.use(frozen):
        async with gateway.store.transaction() as conn:
            for _ in range(201):
                await service.admit(conn)
                frozen.advance(seconds=1)
    newest_first = [user["id"] for user in (await agent.get("/users", params={"limit": "200"})).json()["users"]]
    assert len(newest_first) == 200 and len(set(newest_first)) == 200

    async def ids(**query: str) -> list[str]:
        response = await agent.get("/users", params=query)
        assert response.status_code == 200, response.text
        return [user["id"] for user in response.json()["users"]]

    assert await ids() == newest_first[:50]
    assert await ids(limit="1") == newest_first[:1]
    assert await ids(limit="199") == newest_first[:199]
    # Spec, Limits: a larger value is 400, not reduced; and integers are canonical decimal only.
    for bad in ["0", "201", "-1", "+1", " 1", "1 ", "01", "1.0", "1e3", "", "abc", "0x10", "99999999999999999999", "١"]:
        response = await agent.get("/users", params={"limit": bad})
        assert response.status_code == 400, bad
        body = response.json()
        assert set(body) == {"statusCode", "error", "message"} and "limit" in body["message"], bad


async def test_get_user(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    user = (await admit(gateway.store)).to_json()
    response = await agent.get(f"/users/{user['id']}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == user
    # The pattern is case-insensitive; ids are stored lower-case.
    response = await agent.get(f"/users/{user['id'].upper()}")
    assert response.status_code == 200 and response.json() == user


@pytest.mark.parametrize(
    "path_id",
    [
        "abc",
        "1",
        "3f2504e04f8941d39a0c0305e82c3301",
        "{3f2504e0-4f89-41d3-9a0c-0305e82c3301}",
        "urn:uuid:3f2504e0-4f89-41d3-9a0c-0305e82c3301",
        "3f2504e0-4f89-41d3-9a0c-0305e82c330",
        "3f2504e0-4f89-41d3-9a0c-0305e82c33011",
        "3f2504g0-4f89-41d3-9a0c-0305e82c3301",
        "%203f2504e0-4f89-41d3-9a0c-0305e82c3301",
        "3f2504e0-4f89-41d3-9a0c-0305e82c3301%00",
        "3f2504e0_4f89_41d3_9a0c_0305e82c3301",
        "%EF%BC%93f2504e0-4f89-41d3-9a0c-0305e82c3301",
    ],
)
async def test_get_user_refuses_what_is_not_a_uuid(agent: httpx.AsyncClient, path_id: str) -> None:
    response = await agent.get(f"/users/{path_id}")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"statusCode", "error", "message"} and body["error"] == "Bad Request"


async def test_get_nobody_over_http(agent: httpx.AsyncClient) -> None:
    response = await agent.get("/users/3f2504e0-4f89-41d3-9a0c-0305e82c3301")
    assert response.status_code == 404
    assert response.json() == {"statusCode": 404, "error": "Not Found", "message": "No User has that id."}


async def test_nothing_removes_or_writes_a_user_over_http(
    gateway: Gateway, agent: httpx.AsyncClient, public: httpx.AsyncClient
) -> None:
    user = (await admit(gateway.store)).to_json()
    for client in (agent, public):
        for method in ("DELETE", "PUT", "PATCH", "POST"):
            for path in (f"/users/{user['id']}", "/users"):
                response = await client.request(method, path, json={"attributes": {"admin": True}})
                assert response.status_code in (404, 405), (method, path)
    assert (await agent.get(f"/users/{user['id']}")).json() == user
    assert not {"delete", "remove", "deactivate"} & {name.split("_")[0] for name in dir(service)}
