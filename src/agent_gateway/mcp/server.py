"""The MCP server of the gateway's tools (the official SDK's low-level ``Server``), whatever carries it.

``/mcp`` (``mcp.endpoint``) and ``agent-gateway mcp`` (``mcp.stdio``) serve the
same server; they differ only in how its tools' requests reach the Agent
server's routes (``mcp.delivery``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from agent_gateway.mcp import resources
from agent_gateway.mcp import tools as tool_table
from agent_gateway.mcp.delivery import Sender

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


def build(send: Sender, available: Mapping[str, tool_table.Tool]) -> Server[Any]:
    """An MCP server whose tools (``available``) call the Agent server's routes with ``send``."""
    definitions = {name: tool.definition for name, tool in available.items()}
    listed = types.ListToolsResult(tools=list(definitions.values()))

    def input_schema(name: str) -> Mapping[str, Any] | None:
        definition = definitions.get(name)
        return None if definition is None else definition.input_schema

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return listed

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = available.get(params.name)
        if tool is None:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"no tool is named {params.name!r}")], is_error=True
            )
        return await tool_table.call(send, tool, params.arguments or {})

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return resources.RESOURCES

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return resources.TEMPLATES

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await resources.read(send, available, str(params.uri))

    async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return resources.PROMPTS

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        return resources.prompt(params.name, INSTRUCTIONS, available)

    server: Server[Any] = Server(
        NAME,
        version=importlib.metadata.version("agent-gateway"),
        title="agent-gateway Agent server",
        instructions=INSTRUCTIONS,
        # Without it, the SDK lists every tool again on each 2026-07-28 call (to check its headers).
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    # The SDK's OpenTelemetry span per message: the gateway exports no traces, and even
    # without an exporter it is a fifth of what the SDK spends on a call.
    server.middleware.clear()
    return server
