"""What every command shares: settings, JSON output, one-line errors, a migrated store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from agent_gateway import config, errors, jsontext
from agent_gateway.store import migrate as migrations
from agent_gateway.store.engine import Store

T = TypeVar("T")

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="gateway.toml (default: $AGENT_GATEWAY_CONFIG)", show_default=False),
]


def fail(message: str) -> typer.Exit:
    """Print one error line; ``raise fail(...)`` exits 1."""
    typer.echo(f"agent-gateway: error: {message}", err=True)
    return typer.Exit(1)


def load_settings(path: Path | None) -> config.Settings:
    try:
        return config.load(path)
    except config.SettingsError as exc:
        raise fail(str(exc)) from None


def print_json(value: Any) -> None:
    typer.echo(jsontext.dumps(value, indent=True).decode())


def parse_json(text: str, what: str) -> Any:
    """JSON from an argument, or from stdin when ``text`` is ``-``."""
    if text == "-":
        text = typer.get_text_stream("stdin").read()
    try:
        return jsontext.loads(text)
    except ValueError as exc:
        raise fail(f"{what} is not valid JSON: {exc}") from None


def with_store(config_path: Path | None, work: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``work`` on a migrated store; a gateway error becomes one line and exit 1."""
    settings = load_settings(config_path)

    async def run() -> T:
        store = Store(settings.database_url)
        try:
            await migrations.upgrade(store.engine)
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except errors.GatewayError as exc:
        raise fail(exc.message) from None
