"""``agent-gateway decisions``: the operator's reads of the Decision log.

``list`` walks cursor windows exactly as the routes do (``--after N``,
``--before N`` or the newest page; ascending by seq either way).
"""

from __future__ import annotations

from typing import Annotated

import typer

from agent_gateway.cli.common import (
    AfterOption,
    BeforeOption,
    ConfigOption,
    WindowLimitOption,
    print_json,
    window,
    with_store,
)
from agent_gateway.decisions import service as decisions
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store

app = typer.Typer(help="Read the Decision log.", no_args_is_help=True)


@app.command("list")
def list_decisions(
    after: AfterOption = None,
    before: BeforeOption = None,
    limit: WindowLimitOption = windows.DEFAULT_LIMIT,
    config_path: ConfigOption = None,
) -> None:
    """Print a window of the Decision log as a JSON array ascending by seq."""
    cursors = window(after, before, limit)

    async def work(store: Store) -> list:
        return [decision.to_json() for decision in await decisions.read(store, cursors)]

    print_json(with_store(config_path, work))


@app.command("show")
def show_decision(
    seq: Annotated[int, typer.Argument(min=1, max=windows.MAX_CURSOR, help="the Decision's number")],
    config_path: ConfigOption = None,
) -> None:
    """Print one Decision as JSON."""

    async def work(store: Store) -> dict:
        return (await decisions.get(store, seq)).to_json()

    print_json(with_store(config_path, work))
