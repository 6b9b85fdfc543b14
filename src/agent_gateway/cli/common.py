"""What every command shares: settings, JSON output, one-line errors, a migrated store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import sqlalchemy as sa
import typer
from sqlalchemy import exc as sa_exc

from agent_gateway import config, errors, ids, jsontext
from agent_gateway.store import migrate as migrations
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store

T = TypeVar("T")

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="gateway.toml (default: $AGENT_GATEWAY_CONFIG)", show_default=False),
]
# The cursor-window options of a numbered log (Decisions, a User's Messages), as the routes take them.
AfterOption = Annotated[
    int | None, typer.Option("--after", min=0, max=windows.MAX_CURSOR, help="walk forwards from this number")
]
BeforeOption = Annotated[
    int | None, typer.Option("--before", min=0, max=windows.MAX_CURSOR, help="walk back from this number")
]
WindowLimitOption = Annotated[
    int, typer.Option("--limit", min=1, max=windows.MAX_LIMIT, help="how many, at most")
]


def fail(message: str) -> typer.Exit:
    """Print one error line; ``raise fail(...)`` exits 1."""
    typer.echo(f"agent-gateway: error: {message}", err=True)
    return typer.Exit(1)


def checked_uuid(name: str, value: str) -> str:
    """``value`` as a stored id (lower case); not a UUID is one line, exit 1."""
    try:
        return ids.uuid(name, value) or ""
    except errors.InvalidInput as exc:
        raise fail(exc.message) from None


def window(after: int | None, before: int | None, limit: int) -> windows.Window:
    """A cursor window: ``--after`` or ``--before`` or neither (the newest page); both is a usage error."""
    if after is not None and before is not None:
        raise typer.BadParameter("give --after or --before, not both")
    return windows.Window(after, before, limit)


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
    """Run ``work`` on the deployment's database, which must hold the current gateway schema.

    Only ``migrate`` and ``serve`` create or upgrade a schema: any other command on a
    missing, empty or older database says to run ``agent-gateway migrate`` and changes
    nothing (on SQLite, not even a new empty file). Failures are one line, exit 1.
    """
    settings = load_settings(config_path)
    url = settings.database_url
    database = sa.make_url(url).database
    if url.startswith("sqlite") and database and database != ":memory:" and not Path(database).exists():
        raise fail(f"database.url {masked(url)}: no database file at {database}: {migrations.RUN_MIGRATE}")

    async def run() -> T:
        store = Store(url)
        try:
            (await migrations.schema(store.engine)).require_current()
            return await work(store)
        finally:
            await store.close()

    return on_database(url, run())


def on_database(url: str, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; a database that cannot be reached or used, or any gateway error, is one line."""
    try:
        return asyncio.run(work)
    except Exception as exc:
        problem = database_problem(exc)
        if problem is not None:
            raise fail(f"database.url {masked(url)}: {problem}") from None
        if isinstance(exc, errors.GatewayError):
            raise fail(exc.message) from None
        raise


def database_problem(exc: BaseException) -> str | None:
    """What went wrong with the database, in one line; None when ``exc`` is not about it."""
    if isinstance(exc, migrations.DatabaseProblem):
        return exc.message
    if isinstance(exc, (OSError, asyncio.TimeoutError)):
        return f"cannot connect: {getattr(exc, 'strerror', None) or exc or 'timed out'}"
    if isinstance(exc, sa_exc.DBAPIError):
        return f"{exc.orig}".strip() or type(exc.orig).__name__
    return None


def masked(url: str) -> str:
    """``url`` with its password shown as ``***``."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return url
