"""``agent-gateway tokens``: issue and revoke Users' Tokens (spec: Authentication 9)."""

from __future__ import annotations

import typer

from agent_gateway.auth import service
from agent_gateway.cli.common import ConfigOption, load_settings, print_json, with_store
from agent_gateway.cli.users import UserId, user_id
from agent_gateway.store.engine import Store

app = typer.Typer(help="Issue and revoke Users' Tokens.", no_args_is_help=True)


@app.command()
def issue(id: UserId, config_path: ConfigOption = None) -> None:
    """Issue an ordinary Token to a User (password or not); print {token, expiresAt, user}."""
    checked = user_id(id)
    ttl_ms = load_settings(config_path).token_ttl_ms

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            return (await service.issue_token(conn, checked, ttl_ms=ttl_ms)).to_json()

    print_json(with_store(config_path, work))


@app.command()
def revoke(id: UserId, config_path: ConfigOption = None) -> None:
    """Revoke every Token of a User (idempotent: a User without Tokens is fine)."""
    checked = user_id(id)

    async def work(store: Store) -> None:
        async with store.transaction() as conn:
            await service.revoke_tokens(conn, checked)

    with_store(config_path, work)
    typer.echo(f"every Token of User {checked} is revoked", err=True)
