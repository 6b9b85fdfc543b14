"""MCP clients (the official SDK's) of a real served gateway: over Streamable HTTP at ``/mcp``
and over stdio through a real ``agent-gateway mcp`` subprocess."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

import httpx
import mcp
import pytest
from mcp.client.stdio import stdio_client

from tests import served

# How a test reaches the tools: Streamable HTTP with the SDK's default negotiation (the
# 2026-07-28 per-request protocol), with the initialize handshake older clients make
# (the way agent CLIs connect today), and over stdio.
TRANSPORTS = ("http", "http-handshake", "stdio")
# A ceiling, not an expectation: a tool call on a loaded machine.
CALL_TIMEOUT_S = 120


def stdio_parameters(gateway: served.ServedGateway, *args: str) -> mcp.StdioServerParameters:
    """``agent-gateway mcp ARGS`` with the deployment's configuration and environment."""
    env = served.cli_env(gateway.config, gateway.env)
    return mcp.StdioServerParameters(command=sys.executable, args=["-m", "agent_gateway", "mcp", *args], env=env)


@contextlib.asynccontextmanager
async def connect(
    gateway: served.ServedGateway, transport: str, *, errlog: TextIO | None = None
) -> AsyncIterator[mcp.Client]:
    """An MCP client session with ``gateway``'s tools over ``transport`` (one of :data:`TRANSPORTS`)."""
    if transport == "stdio":
        params = stdio_parameters(gateway, "--agent-url", gateway.agent_url)
        client = mcp.Client(stdio_client(params, errlog=errlog or sys.stderr), mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S)
    else:
        mode = "legacy" if transport == "http-handshake" else "auto"
        client = mcp.Client(f"{gateway.agent_url}/mcp", mode=mode, read_timeout_seconds=CALL_TIMEOUT_S)
    async with client:
        yield client


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def agent_http(served_gateway: served.ServedGateway) -> Callable[..., httpx.Response]:
    """A request to the served Agent server's spec routes: ``agent_http("GET", "/decisions")``."""

    def request(method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, served_gateway.agent_url + path, timeout=CALL_TIMEOUT_S, **kwargs)

    return request


def text_of(result: mcp.types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, mcp.types.TextContent))


def refused(result: mcp.types.CallToolResult, status: int) -> str:
    """The text of a tool error carrying the route's ``status``; fails on anything else."""
    assert result.is_error, result
    text = text_of(result)
    assert text.startswith(f"{status} "), text
    return text


def succeeded(result: mcp.types.CallToolResult) -> Any:
    """The structured content of a successful call (and its text, the same JSON)."""
    assert not result.is_error, text_of(result)
    assert mcp.types.TextContent in {type(block) for block in result.content}
    return result.structured_content
