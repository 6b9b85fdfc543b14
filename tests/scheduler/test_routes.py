"""The Agent server's /schedules routes: the lifecycle table and every 400, on both backends."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from agent_gateway import clock, config
from agent_gateway.gateway import Gateway

from tests.scheduler.conftest import fire, schedule_rows

ONCE = {"kind": "once", "at": "2030-01-01T13:00:00Z"}
CRON = {"kind": "cron", "expr": "0 9 * * MON-FRI", "tz": "Europe/Paris"}
ERROR_KEYS = {"statusCode", "error", "message"}


def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == ERROR_KEYS and body["statusCode"] == status


async def test_lifecycle(agent: httpx.AsyncClient, frozen: clock.FrozenClock) -> None:
    created = await agent.put(
        "/schedules/daily", json={"spec": CRON, "data": {"k": "v"}, "until": "2030-06-01T00:00:00+02:00"}
    )
    assert created.status_code == 201
    assert created.headers["content-type"] == "application/json"
    schedule = {
        "name": "daily",
        "spec": {"kind": "cron", "expr": "0 9 * * MON-FRI", "tz": "Europe/Paris"},
        "data": {"k": "v"},
        "until": "2030-05-31T22:00:00.000Z",
        "nextFireAt": "2030-01-02T08:00:00.000Z",
    }
    assert created.json() == schedule
    assert (await agent.get("/schedules/daily")).json() == schedule

    replaced = await agent.put("/schedules/daily", json={"spec": ONCE})
    assert replaced.status_code == 200
    assert replaced.json() == {
        "name": "daily",
        "spec": {"kind": "once", "at": "2030-01-01T13:00:00.000Z"},
        "data": None,
        "until": None,
        "nextFireAt": "2030-01-01T13:00:00.000Z",
    }
    assert (await agent.get("/schedules")).json() == {"schedules": [replaced.json()]}

    deleted = await agent.delete("/schedules/daily")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_error(await agent.get("/schedules/daily"), 404)
    assert_error(await agent.delete("/schedules/daily"), 404)
    assert (await agent.get("/schedules")).json() == {"schedules": []}


async def test_spent_schedules_are_absent_from_every_read(
    gateway: Gateway, agent: httpx.AsyncClient, frozen: clock.FrozenClock
) -> None:
    assert gateway.schedule_timer is not None
    await gateway.schedule_timer.stop()  # only the fire step below fires
    await agent.put("/schedules/once", json={"spec": ONCE})
    await agent.put(
        "/schedules/cron", json={"spec": {"kind": "cron", "expr": "0 13 * * *"}, "until": "2030-01-01T13:30:00Z"}
    )
    frozen.set("2030-01-01T13:00:00Z")
    await fire(gateway.store)
    assert await schedule_rows(gateway.store) == {}
    assert (await agent.get("/schedules")).json() == {"schedules": []}
    for name in ("once", "cron"):
        assert_error(await agent.get(f"/schedules/{name}"), 404)
        assert_error(await agent.delete(f"/schedules/{name}"), 404)
    # A spent name is absent: writing it again arms a new Schedule.
    frozen.set("2030-01-01T13:00:01Z")
    assert (
        await agent.put("/schedules/once", json={"spec": {"kind": "once", "at": "2030-01-02T00:00:00Z"}})
    ).status_code == 201


async def test_name_limits(agent: httpx.AsyncClient, frozen: clock.FrozenClock) -> None:
    longest = "N" * 128
    assert (await agent.put(f"/schedules/{longest}", json={"spec": ONCE})).status_code == 201
    assert (await agent.get(f"/schedules/{longest}")).json()["name"] == longest
    assert (await agent.put("/schedules/a.b-c_D9", json={"spec": ONCE})).status_code == 201


@pytest.mark.parametrize("name", ["N" * 129, "a%20b", "%C3%A9", "a%00b", "a:b", "a%2Bb"])
async def test_bad_names_are_400_on_every_route(agent: httpx.AsyncClient, frozen: clock.FrozenClock, name: str) -> None:
    assert_error(await agent.put(f"/schedules/{name}", json={"spec": ONCE}), 400)
    assert_error(await agent.get(f"/schedules/{name}"), 400)
    assert_error(await agent.delete(f"/schedules/{name}"), 400)
    assert (await agent.get("/schedules")).json() == {"schedules": []}


@pytest.mark.parametrize(
    "body",
    [
        {"spec": ONCE, "extra": 1},  # unknown field
        {"spec": {**ONCE, "tz": "UTC"}},  # unknown field inside spec
        {"spec": {**CRON, "until": "2031-01-01T00:00:00Z"}},
        {"spec": {"kind": "hourly", "at": "2030-01-01T13:00:00Z"}},  # unknown kind
        {"spec": {"at": "2030-01-01T13:00:00Z"}},
        {"spec": ONCE, "until": "2031-01-01T00:00:00Z"},  # once with until
        {"spec": {"kind": "cron", "expr": "0 9 * *"}},  # invalid expr
        {"spec": {"kind": "cron", "expr": "0 9 * * * * *"}},
        {"spec": {"kind": "cron", "expr": "0 0 30 2 *"}},  # never fires
        {"spec": {"kind": "cron", "expr": "0 9 * * *", "tz": "Europe/Pariss"}},  # unknown tz
        {"spec": {"kind": "cron", "expr": "0 9 * * *", "tz": ""}},
        {"spec": {"kind": "cron", "expr": "0 9 * * *", "tz": "localtime"}},
        {"spec": {"kind": "once", "at": "2030-01-01T13:00:00"}},  # malformed at: no offset
        {"spec": {"kind": "once", "at": "2030-02-30T13:00:00Z"}},
        {"spec": CRON, "until": "2031-13-01T00:00:00Z"},  # malformed until
        {"spec": CRON, "until": "2031-01-01"},
        {"spec": {"kind": "once", "at": "2030-01-01T11:59:59.999Z"}},  # once already past
        {"spec": {"kind": "cron", "expr": "0 13 * * *"}, "until": "2030-01-01T13:00:00Z"},  # until at next
        {"spec": {"kind": "cron", "expr": "0 13 * * *"}, "until": "2030-01-01T12:30:00Z"},  # until before next
        {"spec": {"kind": "once", "at": 1893502800}},  # no coercion
        {"spec": {"kind": "cron", "expr": ["0", "9", "*", "*", "*"]}},
        {"spec": {"kind": "cron", "expr": "0 9 * * *", "tz": ["UTC"]}},
        {"spec": CRON, "until": 1924992000},
        {"spec": "once"},
        {"spec": None},
        {"data": 1},  # spec missing
        [{"spec": ONCE}],  # not an object
        "spec",
        None,
    ],
)
async def test_invalid_put_is_400_and_stores_nothing(
    agent: httpx.AsyncClient, frozen: clock.FrozenClock, body: Any
) -> None:
    kept = await agent.put(
        "/schedules/kept", json={"spec": {"kind": "once", "at": "2031-01-01T00:00:00Z"}, "data": "kept"}
    )
    for name in ("kept", "new"):
        assert_error(await agent.put(f"/schedules/{name}", json=body), 400)
    assert (await agent.get("/schedules")).json() == {"schedules": [kept.json()]}


async def test_put_body_must_be_json(agent: httpx.AsyncClient, frozen: clock.FrozenClock) -> None:
    assert_error(await agent.put("/schedules/x"), 400)
    assert_error(
        await agent.put("/schedules/x", content=b'{"spec": ', headers={"content-type": "application/json"}), 400
    )
    assert_error(await agent.put("/schedules/x", content=b'{"spec": {}}', headers={"content-type": "text/plain"}), 415)
    assert (await agent.get("/schedules")).json() == {"schedules": []}


async def test_until_null_is_no_until(agent: httpx.AsyncClient, frozen: clock.FrozenClock) -> None:
    response = await agent.put("/schedules/x", json={"spec": ONCE, "until": None, "data": None})
    assert response.status_code == 201
    assert response.json()["until"] is None and response.json()["data"] is None


async def test_any_query_parameter_is_400_and_stores_nothing(
    agent: httpx.AsyncClient, frozen: clock.FrozenClock
) -> None:
    for params in ({"x": "1"}, {"limit": "5"}, {"name": "x"}):
        assert_error(await agent.put("/schedules/x", params=params, json={"spec": ONCE}), 400)
    assert (await agent.get("/schedules")).json() == {"schedules": []}
    await agent.put("/schedules/x", json={"spec": ONCE})
    assert_error(await agent.get("/schedules/x", params={"limit": "1"}), 400)
    assert_error(await agent.delete("/schedules/x", params={"force": "1"}), 400)
    assert (await agent.get("/schedules/x")).status_code == 200


async def test_list_order_and_limit(agent: httpx.AsyncClient, frozen: clock.FrozenClock) -> None:
    for index in range(201):
        at = "2030-01-01T13:00:00Z" if index % 2 else f"2030-01-01T14:{index // 60:02d}:{index % 60:02d}Z"
        assert (
            await agent.put(f"/schedules/s{index:03d}", json={"spec": {"kind": "once", "at": at}})
        ).status_code == 201
    default = (await agent.get("/schedules")).json()["schedules"]
    assert len(default) == 50
    everything = (await agent.get("/schedules", params={"limit": "200"})).json()["schedules"]
    assert len(everything) == 200
    keys = [(s["nextFireAt"], s["name"]) for s in everything]
    assert keys == sorted(keys)
    assert everything[0]["name"] == "s001" and everything[99]["name"] == "s199"
    assert default == everything[:50]
    assert (await agent.get("/schedules", params={"limit": "1"})).json()["schedules"] == everything[:1]


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=201",
        "limit=-1",
        "limit=1.0",
        "limit=abc",
        "limit=",
        "limit=01",
        "limit=5&limit=5",
        "after=1",
        "x=1",
    ],
)
async def test_list_refuses_bad_parameters(agent: httpx.AsyncClient, query: str) -> None:
    assert_error(await agent.get(f"/schedules?{query}"), 400)


async def test_agent_routes_can_be_switched_off(settings: config.Settings) -> None:
    gateway = Gateway(dataclasses.replace(settings, scheduler_agent_routes=False))
    await gateway.start()
    try:
        transport = httpx.ASGITransport(app=gateway.agent_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            assert_error(await client.get("/schedules"), 404)
            assert_error(await client.put("/schedules/x", json={"spec": ONCE}), 404)
            assert_error(await client.get("/schedules/x"), 404)
            assert_error(await client.delete("/schedules/x"), 404)
            paths = (await client.get("/openapi.json")).json()["paths"]
            assert not any(path.startswith("/schedules") for path in paths)
            assert "/users" in paths
    finally:
        await gateway.stop()


async def test_openapi_describes_the_routes(agent: httpx.AsyncClient) -> None:
    paths = (await agent.get("/openapi.json")).json()["paths"]
    assert set(paths["/schedules/{name}"]) == {"get", "put", "delete"}
    put = paths["/schedules/{name}"]["put"]
    assert {"200", "201", "400"} <= set(put["responses"])
    schema = put["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["spec"] and schema["additionalProperties"] is False
    assert "404" in paths["/schedules/{name}"]["delete"]["responses"]
