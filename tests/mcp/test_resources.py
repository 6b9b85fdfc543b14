"""The resources (the Decision log, a User's Message log) and the prompt, over every transport, on
both backends: read back equal to the spec's routes; a refused read is a protocol error with the
route's message."""

from __future__ import annotations

import json
import uuid

import httpx
import mcp
import pytest

from tests import served
from tests.mcp.conftest import connect, succeeded
from tests.mcp.test_tools import TABLE

pytestmark = pytest.mark.processes


async def test_resources_read_what_the_routes_answer_and_the_prompt_explains_the_tools(
    served_gateway: served.ServedGateway, transport: str
) -> None:
    user = served_gateway.cli_json("users", "add")
    agent = served_gateway.agent_url
    async with connect(served_gateway, transport) as client:
        succeeded(await client.call_tool("publish_decision", {"statement": "read me"}))
        succeeded(await client.call_tool("send_message", {"userId": user["id"], "text": "hello"}))
        assert [r.uri for r in (await client.list_resources()).resources] == ["gateway://decisions"]
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["gateway://messages/{userId}"]

        decisions = (await client.read_resource("gateway://decisions")).contents[0]
        assert decisions.mime_type == "application/json"
        assert json.loads(decisions.text) == httpx.get(f"{agent}/decisions").json()
        log = (await client.read_resource(f"gateway://messages/{user['id']}")).contents[0]
        assert json.loads(log.text) == httpx.get(f"{agent}/messages", params={"user": user["id"]}).json()
        assert [m["text"] for m in json.loads(log.text)["messages"]] == ["hello"]
        nobody = (await client.read_resource(f"gateway://messages/{uuid.uuid4()}")).contents[0]
        assert json.loads(nobody.text) == {"messages": []}

        with pytest.raises(mcp.MCPError) as malformed:
            await client.read_resource("gateway://messages/not-a-uuid")
        assert malformed.value.code == mcp.types.INVALID_PARAMS and "user must be a UUID" in malformed.value.message
        with pytest.raises(mcp.MCPError) as absent:
            await client.read_resource("gateway://schedules")
        assert absent.value.code == -32002

        assert [p.name for p in (await client.list_prompts()).prompts] == ["agent-gateway"]
        explained = (await client.get_prompt("agent-gateway")).messages[0].content.text
        assert all(f"- {name}: " in explained for name in TABLE)
        with pytest.raises(mcp.MCPError):
            await client.get_prompt("another")
        # ...and the session still works.
        assert succeeded(await client.call_tool("list_users", {}))["users"][0]["id"] == user["id"]
