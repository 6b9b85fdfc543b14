"""The MCP server of the gateway's tools (the official SDK's low-level ``Server``), whatever carries it.

``/mcp`` (``mcp.endpoint``) and ``agent-gateway mcp`` (``mcp.stdio``) serve the
same server; they differ only in the ``httpx`` client its tools call the Agent
server's routes with (``mcp.tools``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import httpx
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from agent_gateway.mcp import tools as tool_table

NAME = "agent-gateway"
INSTRUCTIONS = (
    "These tools are the Agent server of an agent-gateway: the gateway between you (one shared agent) and "
    "the Users you serve. Users write to you in their Message logs; answer a User with send_message "
    "(read the conversation with read_messages). publish_decision numbers, signs and publishes a "
    "Statement for good in the one public Decision log; sign_statement signs without storing anything. "
    "Schedules (put_schedule and the others) wake you later with a Signal. Signals, Runs and Users are "
    "read-only views. A tool error carries the route's status and message: 400 is invalid input, 404 "
    "names a record that does not exist, 503 on send_message means not recorded, send it again. A "
    "refused call changes nothing."
)


def build(http: httpx.AsyncClient, available: Mapping[str, tool_table.Tool]) -> Server[Any]:
    """An MCP server whose tools (``available``) call the Agent server's routes with ``http``."""
    listed = types.ListToolsResult(tools=[tool.definition() for tool in available.values()])

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return listed

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = available.get(params.name)
        if tool is None:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"no tool is named {params.name!r}")], is_error=True
            )
        return await tool_table.call(http, tool, params.arguments or {})

    server: Server[Any] = Server(
        NAME,
        version=importlib.metadata.version("agent-gateway"),
        title="agent-gateway Agent server",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    return server
