"""``agent-gateway prune``: remove Signals that ended long ago, with their Runs, and closed webhook deliveries."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from agent_gateway import config
from agent_gateway.cli.common import ConfigOption, print_json, with_store
from agent_gateway.signals import retention
from agent_gateway.store.engine import Store


def _age(text: str) -> timedelta:
    try:
        return config.parse_age(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def prune(
    before: Annotated[
        timedelta,
        typer.Option(
            "--before",
            parser=_age,
            metavar="AGE",
            help="remove what ended more than AGE ago: 30d, 12h, 90m, 0s (everything ended)",
            show_default=False,
        ),
    ],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only count what would be removed")] = False,
    config_path: ConfigOption = None,
) -> None:
    """Remove done and failed Signals that ended before the cutoff, with their Runs, and webhook
    deliveries delivered or dead before it, and print how many went (JSON). Pending and
    processing Signals, pending and retrying deliveries, Messages, Decisions, Users, Tokens
    and Schedules are never touched. Safe while the gateway serves: it works in small batches."""

    async def work(store: Store) -> dict:
        return (await retention.prune(store, before, dry_run=dry_run)).to_json()

    print_json(with_store(config_path, work))
