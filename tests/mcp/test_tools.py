"""Every tool over every transport, on both backends: listed with the spec's schemas, called, its effect
read back through the spec's HTTP routes, and every refusal a tool error that stores nothing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from agent_gateway.mcp import tools

from tests import served
from tests.mcp.conftest import CALL_TIMEOUT_S, connect, refused, succeeded, text_of

pytestmark = pytest.mark.processes

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
# The issue's table: these names, these arguments (required ones first).
TABLE = {
    "send_message": ({"userId", "text"}, set()),
    "read_messages": ({"userId"}, {"after", "before", "limit"}),
    "publish_decision": ({"statement"}, set()),
    "read_decisions": (set(), {"after", "before", "limit"}),
    "get_decision": ({"seq"}, set()),
    "sign_statement": ({"statement"}, {"typ"}),
    "put_schedule": ({"name", "spec"}, {"data", "until"}),
    "get_schedule": ({"name"}, set()),
    "delete_schedule": ({"name"}, set()),
    "list_schedules": (set(), {"limit"}),
    "get_user": ({"id"}, set()),
    "list_users": (set(), {"limit"}),
    "get_run": ({"id"}, set()),
    "list_runs": (set(), {"limit", "signalId"}),
    "get_signal": ({"id"}, set()),
    "list_signals": (set(), {"limit", "kind"}),
}
Agent = Callable[..., httpx.Response]


def body(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


@pytest.fixture(scope="module")
def served_gateway(shared_gateway: served.ServedGateway) -> served.ServedGateway:
    """No test here changes the gateway's configuration, and each works on a User and Schedules of
    its own: they share one gateway per backend (``agent_http`` reads the same one)."""
    return shared_gateway


def in_an_hour() -> str:
    return (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()


async def test_the_tools_are_listed_with_the_spec_bounds(served_gateway: served.ServedGateway, transport: str) -> None:
    async with connect(served_gateway, transport) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == set(TABLE)
    for name, (required, optional) in TABLE.items():
        schema = listed[name].input_schema
        assert set(schema["properties"]) == required | optional, name
        assert set(schema["required"]) == required, name
        assert schema["additionalProperties"] is False
        assert listed[name].description and listed[name].output_schema["type"] == "object"
        for argument in ("limit",):
            if argument in schema["properties"]:
                assert (schema["properties"]["limit"]["minimum"], schema["properties"]["limit"]["maximum"]) == (1, 200)
        for argument in ("userId", "id", "signalId"):
            if argument in schema["properties"]:
                assert schema["properties"][argument]["pattern"] == UUID_PATTERN, (name, argument)
    for name, argument in [("send_message", "text"), ("publish_decision", "statement"), ("sign_statement", "statement")]:
        assert listed[name].input_schema["properties"][argument]["minLength"] == 1
    assert listed["sign_statement"].input_schema["properties"]["typ"]["maxLength"] == 128
    assert listed["get_decision"].input_schema["properties"]["seq"]["minimum"] == 1
    assert listed["put_schedule"].input_schema["properties"]["name"]["pattern"] == "^[A-Za-z0-9._-]{1,128}$"
    kinds = {variant["properties"]["kind"]["const"] for variant in listed["put_schedule"].input_schema["properties"]["spec"]["oneOf"]}
    assert kinds == {"once", "cron"}
    # What a model is told: what is permanent, what is stored nowhere, what a 503 means.
    assert "permanent" in listed["publish_decision"].description
    assert "stored nowhere" in listed["sign_statement"].description
    assert "503" in listed["send_message"].description and "again" in listed["send_message"].description


async def test_every_tool_answers_its_route_s_body(
    served_gateway: served.ServedGateway, transport: str, agent_http: Agent
) -> None:
    user = served_gateway.cli_json("users", "add")
    token = served_gateway.cli_json("tokens", "issue", user["id"])["token"]
    async with connect(served_gateway, transport) as client:

        async def call(tool: str, **arguments: Any) -> Any:
            return succeeded(await client.call_tool(tool, arguments))

        # Messages: the outbound Message, read back as stored.
        sent = await call("send_message", userId=user["id"], text="hello ü")
        assert (sent["userId"], sent["direction"], sent["seq"], sent["text"]) == (user["id"], "outbound", 1, "hello ü")
        log = body(agent_http("GET", "/messages", params={"user": user["id"]}))
        assert log == {"messages": [sent]}
        assert await call("read_messages", userId=user["id"], after=0, limit=5) == log
        assert await call("read_messages", userId=user["id"].upper(), before=1) == {"messages": []}

        # Decisions: numbered, signed, published; read back equal.
        decision = await call("publish_decision", statement="we ship on Friday")
        assert decision == body(agent_http("GET", f"/decisions/{decision['seq']}"))
        assert await call("get_decision", seq=decision["seq"]) == decision
        assert await call("read_decisions") == body(agent_http("GET", "/decisions"))
        assert await call("read_decisions", after=decision["seq"] - 1, limit=1) == {"decisions": [decision]}

        # A signed Statement: verifies against the Public server's key, payload {statement} only.
        for arguments, typ in [({}, "service-statement+jws"), ({"typ": "note+jws"}, "note+jws")]:
            jws = (await call("sign_statement", statement="a statement", **arguments))["jws"]
            checked = served_gateway.cli_json("verify", jws, "--jwks", f"{served_gateway.public_url}/jwks.json")
            assert checked["verified"] and checked["header"]["typ"] == typ
            assert checked["payload"] == {"statement": "a statement"}

        # Schedules: armed, read, listed, replaced, cancelled; each read back through the routes.
        spec = {"kind": "cron", "expr": "0 9 * * *", "tz": "Europe/Paris"}
        armed = await call("put_schedule", name="daily.digest", spec=spec, data={"team": "ops"})
        assert armed == body(agent_http("GET", "/schedules/daily.digest"))
        assert (armed["spec"], armed["data"], armed["until"]) == (spec, {"team": "ops"}, None)
        once = await call("put_schedule", name="reminder", spec={"kind": "once", "at": in_an_hour()})
        assert once["data"] is None and once == await call("get_schedule", name="reminder")
        assert await call("list_schedules") == body(agent_http("GET", "/schedules"))
        assert await call("list_schedules", limit=1) == body(agent_http("GET", "/schedules", params={"limit": "1"}))
        replaced = await call("put_schedule", name="daily.digest", spec={"kind": "cron", "expr": "0 10 * * *"}, data=None)
        assert replaced == body(agent_http("GET", "/schedules/daily.digest")) and replaced["spec"]["tz"] == "UTC"
        assert await call("delete_schedule", name="reminder") == {}
        assert agent_http("GET", "/schedules/reminder").status_code == 404
        # Gone too, so that no fire of it lands in another test on this shared gateway.
        assert await call("delete_schedule", name="daily.digest") == {}

        # Users.
        assert await call("get_user", id=user["id"]) == body(agent_http("GET", f"/users/{user['id']}"))
        assert await call("list_users", limit=10) == body(agent_http("GET", "/users", params={"limit": "10"}))

        # Signals and Runs: an inbound Message on the Public server wakes the (echo) agent.
        posted = httpx.post(
            f"{served_gateway.public_url}/messages",
            json={"text": "hi agent"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=CALL_TIMEOUT_S,
        )
        assert posted.status_code == 201, posted.text
        signal = (await call("list_signals", kind="message.received", limit=1))["signals"][0]
        assert signal["payload"]["text"] == "hi agent" and signal["payload"]["userId"] == user["id"]
        deadline = time.monotonic() + CALL_TIMEOUT_S * 2
        while (run := body(agent_http("GET", "/runs", params={"signalId": signal["id"]}))["runs"]) == [] or run[0]["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, "the Run did not end"
            await asyncio.sleep(0.2)
        assert await call("get_signal", id=signal["id"]) == body(agent_http("GET", f"/signals/{signal['id']}"))
        assert await call("list_signals") == body(agent_http("GET", "/signals"))
        runs = await call("list_runs", signalId=signal["id"])
        assert runs == {"runs": run} and runs == body(agent_http("GET", "/runs", params={"signalId": signal["id"]}))
        assert await call("get_run", id=run[0]["id"]) == body(agent_http("GET", f"/runs/{run[0]['id']}"))
        assert await call("list_runs", limit=200) == body(agent_http("GET", "/runs", params={"limit": "200"}))


def stored(agent_http: Agent, user_id: str) -> dict[str, Any]:
    """Everything a refused call could have changed, read through the spec's routes."""
    return {
        "messages": body(agent_http("GET", "/messages", params={"user": user_id})),
        "decisions": body(agent_http("GET", "/decisions")),
        "schedules": body(agent_http("GET", "/schedules")),
        "signals": body(agent_http("GET", "/signals")),
    }


async def test_a_refused_call_is_a_tool_error_with_the_route_s_message_and_stores_nothing(
    served_gateway: served.ServedGateway, transport: str, agent_http: Agent
) -> None:
    user = served_gateway.cli_json("users", "add")
    nobody = str(uuid.uuid4())
    async with connect(served_gateway, transport) as client:
        succeeded(await client.call_tool("send_message", {"userId": user["id"], "text": "before"}))
        succeeded(await client.call_tool("put_schedule", {"name": "kept", "spec": {"kind": "once", "at": in_an_hour()}}))
        before = stored(agent_http, user["id"])

        async def refusal(status: int, tool: str, **arguments: Any) -> str:
            return refused(await client.call_tool(tool, arguments), status)

        # The section 4 list, each with the route's own status and message.
        assert "No User has that id" in await refusal(404, "send_message", userId=nobody, text="to nobody")
        assert "text" in await refusal(400, "send_message", userId=user["id"], text="")
        assert "userId must be a UUID" in await refusal(400, "send_message", userId="not-a-uuid", text="x")
        assert "past" in await refusal(400, "put_schedule", name="late", spec={"kind": "once", "at": "2000-01-01T00:00:00Z"})
        assert "no live Schedule is named 'absent'" in await refusal(404, "delete_schedule", name="absent")
        assert "No Decision has that number" in await refusal(404, "get_decision", seq=2_000_000)
        # The rest of the routes' refusals come through the same way.
        await refusal(400, "publish_decision", statement="")
        await refusal(400, "sign_statement", statement="x", typ="")
        await refusal(400, "put_schedule", name="bad name", spec={"kind": "cron", "expr": "0 9 * * *"})
        await refusal(400, "put_schedule", name="x", spec={"kind": "cron", "expr": "not cron"})
        await refusal(400, "put_schedule", name="x", spec={"kind": "once", "at": in_an_hour()}, until=in_an_hour())
        assert "limit must be an integer from 1 to 200" in await refusal(400, "read_decisions", limit=201)
        assert "after and before cannot be combined" in await refusal(400, "read_messages", userId=user["id"], after=1, before=2)
        await refusal(400, "get_decision", seq=0)
        await refusal(400, "get_user", id="nope")
        await refusal(404, "get_user", id=nobody)
        await refusal(404, "get_run", id=nobody)
        await refusal(404, "get_signal", id=nobody)
        await refusal(400, "list_runs", signalId="nope")
        await refusal(404, "get_schedule", name="absent")
        # What no route could be given: refused by the tool, with nothing sent.
        assert "takes no argument 'user'" in await refusal(400, "read_decisions", user=user["id"])
        assert "statement is required" in await refusal(400, "publish_decision")
        assert "limit must be an integer" in await refusal(400, "list_users", limit="5")
        assert "limit must be an integer" in await refusal(400, "list_users", limit=True)
        unknown = await client.call_tool("drop_tables", {})
        assert unknown.is_error and "no tool is named" in text_of(unknown)

        assert stored(agent_http, user["id"]) == before
        # ...and the session still works.
        assert succeeded(await client.call_tool("list_users", {}))["users"][0]["id"] == user["id"]


def test_the_tool_table_is_the_issue_s() -> None:
    """The names and arguments the LLM agent (and every MCP client) is written against."""
    assert {tool.name: set(tool.properties) for tool in tools.TOOLS} == {
        name: required | optional for name, (required, optional) in TABLE.items()
    }
    assert set(tools.available(schedules=False)) == set(TABLE) - tools.SCHEDULE_TOOLS
    json.dumps([tool.definition.model_dump(by_alias=True) for tool in tools.TOOLS])
