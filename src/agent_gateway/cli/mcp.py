"""``agent-gateway mcp``: the Agent server's capabilities as MCP tools over stdio (``agent_gateway.mcp``)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Annotated

import typer

from agent_gateway import config
from agent_gateway.agent.client import URL_ENV
from agent_gateway.cli.common import ConfigOption, fail, load_settings
from agent_gateway.ops import logs

# Where a server that listens on every address is reached from this machine.
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def mcp(
    agent_url: Annotated[
        str | None,
        typer.Option(
            "--agent-url",
            help=f"the Agent server to call (default: ${URL_ENV}, then the address agent.listen of the configuration)",
            show_default=False,
        ),
    ] = None,
    config_path: ConfigOption = None,
) -> None:
    """Serve the Agent server's capabilities as MCP tools over stdio, for an agent program that takes an
    MCP server as a command.

    Each tool call is one request to the Agent server over HTTP.
    stdout carries the protocol only; logs go to stderr."""
    level = "WARNING"
    url = agent_url or os.environ.get(URL_ENV)
    if not url:
        if config_path is None and not os.environ.get(config.CONFIG_ENV):
            raise fail(
                f"no Agent server: pass --agent-url, set ${URL_ENV}, or give the configuration "
                f"(--config or ${config.CONFIG_ENV})"
            )
        settings = load_settings(config_path)
        url = agent_address(settings.agent_listen)
        level = settings.log_level
    if not url.startswith(("http://", "https://")):
        raise fail(f"--agent-url must be an http:// or https:// URL (got {url!r})")
    logs.configure(level)
    from agent_gateway.mcp import stdio  # the SDK is loaded by this command only

    logging.getLogger(__name__).info("serving MCP over stdio for the Agent server at %s", url)
    asyncio.run(stdio.serve(url))


def agent_address(listen: config.Address) -> str:
    """The URL of an Agent server that listens on ``listen``, as seen from this machine."""
    host = _ANY_ADDRESS.get(listen.host, listen.host)
    return f"http://{config.Address(host, listen.port)}"
