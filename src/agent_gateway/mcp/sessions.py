"""The MCP SDK's side of ``/mcp`` (``mcp.endpoint``), imported by its first request."""

from __future__ import annotations

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import ASGIApp

from agent_gateway.config import Settings
from agent_gateway.mcp import delivery, tools
from agent_gateway.mcp import server as mcp_server


def manager(routes: ASGIApp, settings: Settings) -> StreamableHTTPSessionManager:
    """The SDK's session manager of the gateway's tools, calling the Agent server's ``routes``."""
    available = tools.available(schedules=settings.scheduler_agent_routes)
    return StreamableHTTPSessionManager(
        app=mcp_server.build(delivery.in_process(routes), available),
        json_response=True,
        stateless=True,
        max_request_body_size=settings.max_body_bytes,
        # Off here, not off: the Agent server's connections refuse a Host or Origin that
        # is not one of its own names for every route, /mcp included (http.connections.Hosts,
        # ports not compared, as the sandbox's relay needs), before the request reaches an app.
        security_settings=None,
    )
