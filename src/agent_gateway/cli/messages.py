"""``agent-gateway messages``: the operator's read of a User's Message log.

It walks cursor windows exactly as the routes do (``--after N``, ``--before N``
or the newest page; ascending by seq either way).
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
from agent_gateway.messages import service as messages
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users

app = typer.Typer(help="Read a User's Message log.", no_args_is_help=True)


@app.command("list")
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
