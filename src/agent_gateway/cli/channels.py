"""``agent-gateway pairing`` and ``agent-gateway channels``: strangers asking on a chat channel, and what a channel sends."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from agent_gateway.channels import outbox, pairing
from agent_gateway.cli.common import ConfigOption, checked_uuid, print_json, with_store
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries

pairing_app = typer.Typer(
    help="Pairing requests: people on a chat channel who asked to talk to the agent (see the pairing policy).",
    no_args_is_help=True,
)
channels_app = typer.Typer(help="Chat channels: what they send to people.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
CodeArgument = Annotated[str, typer.Argument(help="the 8-character pairing code the person was sent")]


@pairing_app.command("list")
def list_(json_: JsonOption = False, config_path: ConfigOption = None) -> None:
    """Print the pending pairing requests, oldest first (a JSON array with --json)."""

    async def work(store: Store) -> list:
        async with store.read() as conn:
            return [request.to_json() for request in await pairing.pending(conn)]

    found = with_store(config_path, work)
    if json_:
        print_json(found)
        return
    for request in found:
        typer.echo(f"{request['code']}  {request['identity']}  asked {request['createdAt']}")
    if not found:
        typer.echo("no pending pairing requests", err=True)


@pairing_app.command("approve")
def approve(
    code: CodeArgument,
    user: Annotated[
        str | None, typer.Option("--user", help="link the identity to this existing User instead of admitting a new one")
    ] = None,
    json_: JsonOption = False,
    config_path: ConfigOption = None,
) -> None:
    """Approve a request: admit a new User (or link to --user) and link the person's identity; print the User id."""
    user_id = None if user is None else checked_uuid("--user", user)

    async def work(store: Store) -> pairing.Approved:
        async with store.transaction() as conn:
            return await pairing.approve(conn, code, user_id)

    approved = with_store(config_path, work)
    if json_:
        print_json({"user": approved.user_id, "identity": approved.identity})
    else:
        typer.echo(approved.user_id)


@pairing_app.command("deny")
def deny(code: CodeArgument, config_path: ConfigOption = None) -> None:
    """Deny a request: its code stops working (the person gets a new one if they write again)."""

    async def work(store: Store) -> str:
        async with store.transaction() as conn:
            return (await pairing.deny(conn, code)).identity

    typer.echo(f"denied the pairing request of {with_store(config_path, work)}", err=True)


DeliveryState = enum.Enum("DeliveryState", {state: state for state in queries.STATES}, type=str)  # type: ignore[misc]


@channels_app.command("deliveries")
def deliveries(
    state: Annotated[
        DeliveryState | None,
        typer.Option(
            "--state",
            help="only deliveries in this state: pending (not tried yet), failed (waiting for a retry), "
            "delivered, dead (not delivered for a day)",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="how many, newest first")] = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print channel deliveries (outbound Messages and the channels' notices) as a JSON array, newest first."""

    async def work(store: Store) -> list:
        return [delivery.to_json() for delivery in await outbox.newest(store, limit=limit, state=state and state.value)]

    print_json(with_store(config_path, work))
