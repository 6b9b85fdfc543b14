"""``agent-gateway mcp``: the gateway's tools over stdio, calling a running Agent server over HTTP.

For agent programs that take an MCP server as a command. The SDK's
``stdio_server`` owns the process's stdout while it serves (anything else
written there goes to stderr), so stdout carries the protocol and nothing else.
"""

from __future__ import annotations

import httpx
from mcp.server.stdio import stdio_server

from agent_gateway.agent.client import TIMEOUT_S
from agent_gateway.mcp import server as mcp_server
from agent_gateway.mcp import delivery, tools


async def serve(agent_url: str) -> None:
    """Serve the tools on stdin/stdout until stdin ends; each call is one request to ``agent_url``."""
    async with httpx.AsyncClient(base_url=agent_url.rstrip("/"), timeout=TIMEOUT_S) as http:
        server = mcp_server.build(delivery.over_http(http), tools.available())
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
