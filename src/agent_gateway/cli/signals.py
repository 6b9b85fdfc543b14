"""``agent-gateway signals`` and ``agent-gateway runs``: the operator's reads of the queue and what the agent did."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from agent_gateway.cli.common import ConfigOption, checked_uuid, print_json, with_store
from agent_gateway.signals import service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_states
from agent_gateway.store.queries import signals as signal_states

signals_app = typer.Typer(help="Read Signals, the queue that wakes the agent; cancel a pending one.", no_args_is_help=True)
runs_app = typer.Typer(help="Read Runs, each execution of the agent for a Signal; cancel one.", no_args_is_help=True)

LimitOption = Annotated[int, typer.Option("--limit", min=1, help="how many, newest first")]
# The states a read filters on, as the store names them.
SignalState = enum.Enum(  # type: ignore[misc]
    "SignalState", {state: state for state in signal_states.STATES}, type=str
)
RunState = enum.Enum("RunState", {state: state for state in run_states.STATES}, type=str)  # type: ignore[misc]


@signals_app.command("list")
def list_signals(
    state: Annotated[
        SignalState | None, typer.Option("--state", help="only Signals in this state")
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="only Signals of this kind")] = None,
    limit: LimitOption = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print Signals as a JSON array, newest first."""

    async def work(store: Store) -> list:
        async with store.read() as conn:
            found = await service.list_signals(conn, limit, kind, state=state and state.value)
        return [signal.to_json() for signal in found]

    print_json(with_store(config_path, work))


@signals_app.command("show")
def show_signal(
    id: Annotated[str, typer.Argument(help="the Signal's id (UUID)")], config_path: ConfigOption = None
) -> None:
    """Print one Signal as JSON."""
    checked = checked_uuid("id", id)

    async def work(store: Store) -> dict:
        async with store.read() as conn:
            return (await service.get_signal(conn, checked)).to_json()

    print_json(with_store(config_path, work))


@signals_app.command("cancel")
def cancel_signal(
    id: Annotated[str, typer.Argument(help="the pending Signal's id (UUID)")], config_path: ConfigOption = None
) -> None:
    """Cancel a pending Signal: it ends failed ("cancelled by the operator") and is never run;
    print it as JSON. A Signal that is processing, has ended or does not exist is refused
    (exit 1) and nothing changes."""
    checked = checked_uuid("id", id)

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            return (await service.cancel_signal(conn, checked)).to_json()

    print_json(with_store(config_path, work))


@runs_app.command("list")
def list_runs(
    signal: Annotated[str | None, typer.Option("--signal", help="only the Runs of this Signal (id)")] = None,
    state: Annotated[
        RunState | None, typer.Option("--state", help="only Runs in this state")
    ] = None,
    limit: LimitOption = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print Runs as a JSON array, newest first by startedAt (Runs not started yet first)."""
    signal_id = None if signal is None else checked_uuid("--signal", signal)

    async def work(store: Store) -> list:
        async with store.read() as conn:
            found = await service.list_runs(conn, limit, signal_id, state=state and state.value)
        return [run.to_json() for run in found]

    print_json(with_store(config_path, work))


@runs_app.command("show")
def show_run(id: Annotated[str, typer.Argument(help="the Run's id (UUID)")], config_path: ConfigOption = None) -> None:
    """Print one Run as JSON."""
    checked = checked_uuid("id", id)

    async def work(store: Store) -> dict:
        async with store.read() as conn:
            return (await service.get_run(conn, checked)).to_json()

    print_json(with_store(config_path, work))


@runs_app.command("cancel")
def cancel_run(id: Annotated[str, typer.Argument(help="the Run's id (UUID)")], config_path: ConfigOption = None) -> None:
    """Cancel a pending or running Run and print it as JSON: it ends failed ("cancelled by the
    operator"), with the Runs of its Signal not started yet; the gateway leading the Signal
    Worker, on any host, stops the agent program (SIGTERM to its process group, SIGKILL after
    the grace period) and ends the Signal failed, never to be run again; the next Signal
    follows at once. A Run that has ended or does not exist is refused (exit 1) and nothing
    changes."""
    checked = checked_uuid("id", id)

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            return (await service.cancel_run(conn, checked)).to_json()

    print_json(with_store(config_path, work))
