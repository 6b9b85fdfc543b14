"""``agent-gateway schedules``: the operator's view of Schedules (the same namespace as the agent's)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from agent_gateway.cli.common import ConfigOption, fail, parse_json, print_json, with_store
from agent_gateway.scheduler import service
from agent_gateway.store.engine import Store

app = typer.Typer(help="Arm, list, show and cancel Schedules.", no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="the Schedule's name: 1 to 128 of A-Z a-z 0-9 . _ -")]


@app.command()
def put(
    name: Name,
    at: Annotated[str | None, typer.Option("--at", help="fire once at this instant (ISO 8601 with offset)")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="fire at every occurrence of this cron expression")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="IANA time zone of --cron (default UTC)")] = None,
    until: Annotated[str | None, typer.Option("--until", help="with --cron: no fire after this instant")] = None,
    data: Annotated[
        str | None, typer.Option("--data", help='JSON echoed in every fired Signal, or "-" for stdin')
    ] = None,
    config_path: ConfigOption = None,
) -> None:
    """Arm a Schedule, or replace the live one of that name, and print it as JSON."""
    if (at is None) == (cron is None):
        raise fail("give exactly one of --at or --cron")
    spec: dict[str, Any] = {"kind": "once", "at": at} if at is not None else {"kind": "cron", "expr": cron}
    if tz is not None:
        spec["tz"] = tz  # with --at this is an unknown field, refused by the service
    value = None if data is None else parse_json(data, "data")

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            schedule, _ = await service.put(conn, name, spec, data=value, until=until)
        return schedule.to_json()

    print_json(with_store(config_path, work))


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, help="how many, soonest first")] = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print live Schedules as a JSON array, soonest first (ties by name)."""

    async def work(store: Store) -> list:
        async with store.read() as conn:
            return [schedule.to_json() for schedule in await service.list_soonest(conn, limit)]

    print_json(with_store(config_path, work))


@app.command()
def show(name: Name, config_path: ConfigOption = None) -> None:
    """Print one live Schedule as JSON."""

    async def work(store: Store) -> dict:
        async with store.read() as conn:
            return (await service.get(conn, name)).to_json()

    print_json(with_store(config_path, work))


@app.command()
def delete(name: Name, config_path: ConfigOption = None) -> None:
    """Cancel a live Schedule: all its future fires stop."""

    async def work(store: Store) -> None:
        async with store.transaction() as conn:
            await service.delete(conn, name)

    with_store(config_path, work)
