"""``agent-gateway messages`` and ``agent-gateway decisions``: the operator's reads of the numbered logs.

Both walk cursor windows exactly as the routes do (``--after N``, ``--before N``
or the newest page; ascending by number either way).
"""

from __future__ import annotations

from typing import Annotated

import typer

from agent_gateway.cli.common import (
    AfterOption,
    BeforeOption,
    ConfigOption,
    WindowLimitOption,
    checked_uuid,
    print_json,
    window,
    with_store,
)
from agent_gateway.decisions import service as decisions
from agent_gateway.messages import service as messages
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users

messages_app = typer.Typer(help="Read a User's Message log.", no_args_is_help=True)
decisions_app = typer.Typer(help="Read the Decision log.", no_args_is_help=True)


@messages_app.command("list")
def list_messages(
    user: Annotated[str, typer.Option("--user", help="the User's id (UUID)", show_default=False)],
    after: AfterOption = None,
    before: BeforeOption = None,
    limit: WindowLimitOption = windows.DEFAULT_LIMIT,
    config_path: ConfigOption = None,
) -> None:
    """Print a window of one User's Messages, both directions, as a JSON array ascending by seq."""
    checked = checked_uuid("--user", user)
    cursors = window(after, before, limit)

    async def work(store: Store) -> list:
        async with store.read() as conn:
            await users.get(conn, checked)  # an operator naming nobody has mistyped the id
        return [message.to_json() for message in await messages.read(store, checked, cursors)]

    print_json(with_store(config_path, work))


@decisions_app.command("list")
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


@decisions_app.command("show")
def show_decision(
    seq: Annotated[int, typer.Argument(min=1, max=windows.MAX_CURSOR, help="the Decision's number")],
    config_path: ConfigOption = None,
) -> None:
    """Print one Decision as JSON."""

    async def work(store: Store) -> dict:
        return (await decisions.get(store, seq)).to_json()

    print_json(with_store(config_path, work))
