"""``agent-gateway webhooks``: the operator's view of webhook deliveries, and a retry."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from agent_gateway.cli.common import ConfigOption, checked_uuid, print_json, with_store
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import webhooks as queries
from agent_gateway.webhooks import outbox

app = typer.Typer(
    help="Webhook deliveries: what was sent to the [[webhooks]] endpoints, what waits, what died.",
    no_args_is_help=True,
)

DeliveryState = enum.Enum("DeliveryState", {state: state for state in queries.STATES}, type=str)  # type: ignore[misc]


@app.command("deliveries")
def deliveries(
    state: Annotated[
        DeliveryState | None,
        typer.Option(
            "--state",
            help="only deliveries in this state: pending (not tried yet, or retried by the operator), "
            "failed (waiting for a retry), delivered, dead (retries over)",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="how many, newest event first")] = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print webhook deliveries as a JSON array, newest event first."""

    async def work(store: Store) -> list:
        found = await outbox.newest(store, limit=limit, state=state and state.value)
        return [delivery.to_json() for delivery in found]

    print_json(with_store(config_path, work))


@app.command("retry")
def retry(
    id: Annotated[str, typer.Argument(help="the delivery's id (its webhook-id, a UUID)")],
    config_path: ConfigOption = None,
) -> None:
    """Send a failed or dead delivery again now, with a fresh retry period; print it as JSON.

    A serving gateway's deliverer is woken at once (on SQLite, one serving beside this command)."""
    checked = checked_uuid("id", id)

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            retried = await outbox.retry(conn, checked)
        return retried.to_json()

    print_json(with_store(config_path, work))
