"""``agent-gateway users``: admit Users, manage their Attributes, set their passwords, link chat channel identities."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from agent_gateway.auth import service as auth_service
from agent_gateway.channels import identities
from agent_gateway.cli.common import ConfigOption, checked_uuid, fail, load_settings, parse_json, print_json, with_store
from agent_gateway.store.engine import Store
from agent_gateway.users import service

app = typer.Typer(
    help="Admit Users, manage their Attributes, set their passwords, link their chat channel identities.",
    no_args_is_help=True,
)

UserId = Annotated[str, typer.Argument(help="the User's id (UUID)")]


def user_id(value: str) -> str:
    return checked_uuid("id", value)


@app.command()
def add(config_path: ConfigOption = None) -> None:
    """Admit a new User (Attributes {}) and print it as JSON."""

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            return (await service.admit(conn)).to_json()

    print_json(with_store(config_path, work))


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, help="how many, newest first")] = 50,
    config_path: ConfigOption = None,
) -> None:
    """Print Users as a JSON array, newest first."""

    async def work(store: Store) -> list:
        async with store.read() as conn:
            return [user.to_json() for user in await service.list_newest(conn, limit)]

    print_json(with_store(config_path, work))


@app.command()
def show(id: UserId, config_path: ConfigOption = None) -> None:
    """Print one User as JSON."""
    checked = user_id(id)

    async def work(store: Store) -> dict:
        async with store.read() as conn:
            return (await service.get(conn, checked)).to_json()

    print_json(with_store(config_path, work))


@app.command("set-attributes")
def set_attributes(
    id: UserId,
    attributes: Annotated[str, typer.Argument(help='any JSON value, or "-" to read it from stdin')],
    config_path: ConfigOption = None,
) -> None:
    """Replace a User's Attributes wholesale and print the User as JSON."""
    checked = user_id(id)
    value = parse_json(attributes, "attributes")

    async def work(store: Store) -> dict:
        async with store.transaction() as conn:
            return (await service.set_attributes(conn, checked, value)).to_json()

    print_json(with_store(config_path, work))


def read_password(from_stdin: bool) -> str:
    """The new password: all of stdin (less one final newline), or typed twice at a hidden prompt."""
    if not from_stdin:
        if not sys.stdin.isatty():
            # getpass would warn and read the pipe with echo on; a script means --password-stdin.
            raise fail("stdin is not a terminal: pass --password-stdin to read the password from it")
        return typer.prompt("New password", hide_input=True, confirmation_prompt=True)
    try:
        text = sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        raise fail("the password on stdin is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


@app.command("set-password")
def set_password(
    id: UserId,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="read the password from stdin instead of a prompt")
    ] = False,
    config_path: ConfigOption = None,
) -> None:
    """Set a User's password (also a first one) without the current one; revokes no Token.

    The password is never taken from the command line, where other users of
    the machine could read it.
    """
    checked = user_id(id)
    cost = load_settings(config_path).scrypt
    password = read_password(password_stdin)
    # The Python API takes any length; an empty one here is almost surely a mistake (empty stdin).
    if not password:
        raise fail("the password is empty")

    async def work(store: Store) -> None:
        async with store.transaction() as conn:
            await auth_service.set_password(conn, checked, password, cost=cost)

    with_store(config_path, work)
    typer.echo(f"password set for User {checked}", err=True)


IdentityArgument = Annotated[str, typer.Argument(help="<channel>:<address>, such as matrix:@alice:example.org or nostr:npub1... (stored as hex)")]


@app.command("link")
def link(id: UserId, identity: IdentityArgument, config_path: ConfigOption = None) -> None:
    """Link a chat channel identity to a User: what that person writes there becomes the User's Messages."""
    checked = user_id(id)

    async def work(store: Store) -> None:
        async with store.transaction() as conn:
            await identities.link(conn, checked, identity)

    with_store(config_path, work)
    typer.echo(f"linked {identity} to User {checked}", err=True)


@app.command("unlink")
def unlink(id: UserId, identity: IdentityArgument, config_path: ConfigOption = None) -> None:
    """Remove a chat channel identity from a User."""
    checked = user_id(id)

    async def work(store: Store) -> None:
        async with store.transaction() as conn:
            await identities.unlink(conn, checked, identity)

    with_store(config_path, work)
    typer.echo(f"unlinked {identity} from User {checked}", err=True)


@app.command("identities")
def identities_(
    id: UserId,
    json_: Annotated[bool, typer.Option("--json", help="print a JSON array")] = False,
    config_path: ConfigOption = None,
) -> None:
    """Print a User's chat channel identities, oldest link first."""
    checked = user_id(id)

    async def work(store: Store) -> list:
        async with store.read() as conn:
            return [found.to_json() for found in await identities.of_user(conn, checked)]

    found = with_store(config_path, work)
    if json_:
        print_json(found)
        return
    for entry in found:
        typer.echo(entry["identity"])
