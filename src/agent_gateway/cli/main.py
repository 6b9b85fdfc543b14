"""The operator's command line: ``agent-gateway``.

Every command finds its settings through ``--config PATH`` or
``AGENT_GATEWAY_CONFIG``, prints JSON where a script would read the result,
reads secrets only from a prompt or stdin (never argv), and exits non-zero
with one line on error.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Annotated

import typer

try:  # Typer 0.2x carries its own copy of click, whose exceptions these are
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - an older Typer on the real click
    from click import exceptions as click_errors

from agent_gateway import deployment, errors
from agent_gateway.cli import (
    audit, channels, chat, common, decisions, doctor, keys, mcp, messages, proofs, retention, schedules, sign, signals,
    tokens,
    users,
    webhooks,
)
from agent_gateway.cli.common import ConfigOption, fail, load_settings, masked, on_database, with_store
from agent_gateway.ops import logs
from agent_gateway.store import migrate as migrations
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.users import User

ForceOption = Annotated[
    bool,
    typer.Option(
        "--force", help="add the gateway's tables to a database that has other tables and no gateway schema"
    ),
]

app = typer.Typer(
    name="agent-gateway",
    help="A gateway between one shared AI agent and the people it serves.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(users.app, name="users")
app.add_typer(tokens.app, name="tokens")
app.add_typer(schedules.app, name="schedules")
app.add_typer(keys.app, name="keys")
app.add_typer(signals.signals_app, name="signals")
app.add_typer(signals.runs_app, name="runs")
app.add_typer(messages.app, name="messages")
app.add_typer(decisions.app, name="decisions")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(channels.pairing_app, name="pairing")
app.add_typer(channels.channels_app, name="channels")
app.command("sign")(sign.sign)
app.command("verify")(sign.verify)
app.command("prune")(retention.prune)
app.command("audit")(audit.audit)
app.command("verify-proof")(proofs.verify_proof)
app.command("verify-receipt")(proofs.verify_receipt)
app.command("chat")(chat.chat)
app.command("mcp")(mcp.mcp)
app.command("doctor")(doctor.doctor)


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="folder for gateway.toml and the signing key")],
    demo_user: Annotated[
        bool,
        typer.Option(
            "--demo-user",
            help="also admit a User with a generated password (kept in DIR/demo-user.json, mode 0600) "
            "and print how to log in and talk to the agent",
        ),
    ] = False,
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            help="the agent program: echo (a demo that echoes each Message) or llm (the reference LLM "
            "agent, with --model; needs the llm extra: pip install -e '.[llm]' in a clone)",
        ),
    ] = "echo",
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="with --agent llm: PROVIDER:MODEL, such as openai:gpt-4o or anthropic:claude-sonnet-4-5"
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="with --model openai:...: a server speaking the Chat Completions API instead of OpenAI's, "
            "such as http://127.0.0.1:11434/v1 (Ollama), vLLM or llama.cpp",
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env",
            help="with --agent llm: the environment variable of serve that holds the API key (default: the "
            "provider's usual one, OPENAI_API_KEY for openai:); the key is never written",
        ),
    ] = None,
    matrix_homeserver: Annotated[
        str | None,
        typer.Option("--matrix-homeserver", help="serve the Matrix channel: the homeserver's client-server API base URL"),
    ] = None,
    matrix_user: Annotated[
        str | None, typer.Option("--matrix-user", help="with --matrix-homeserver: the agent's account, @agent:example.org")
    ] = None,
    matrix_token_stdin: Annotated[
        bool,
        typer.Option(
            "--matrix-token-stdin",
            help="read the account's access token from stdin instead of a hidden prompt (written to DIR/matrix-token, mode 0600)",
        ),
    ] = False,
    nostr_relay: Annotated[
        list[str] | None,
        typer.Option(
            "--nostr-relay",
            help="serve the Nostr channel on this relay (wss://, or ws:// on this host; repeat for several): "
            "a new secret key goes to DIR/nostr-key (mode 0600) and its npub is printed",
        ),
    ] = None,
) -> None:
    """Write a commented gateway.toml with working defaults and a fresh Ed25519 signing key.

    With --agent llm, the agent is the reference LLM agent on --model, with an instructions file
    in its Workspace (DIR/workspace/instructions.md) to edit. With --matrix-homeserver and
    --matrix-user, people talk to it from Matrix too; with --nostr-relay, in Nostr direct
    messages (see the Chat channels page)."""
    llm = _llm_agent(agent, model, base_url, api_key_env)
    matrix = _matrix_account(matrix_homeserver, matrix_user, matrix_token_stdin)
    try:
        nostr = deployment.NostrAccount.new(tuple(nostr_relay)) if nostr_relay else None
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:
        written = deployment.write(directory, llm, matrix, nostr)
    except FileExistsError as exc:
        raise fail(f"{exc.filename} exists; init never overwrites") from None
    for path in written:
        typer.echo(f"wrote {path}")
    if nostr is not None:
        typer.echo(f"the agent's Nostr public key: {nostr.npub}")
    if llm is not None:
        typer.echo(llm_instructions(llm))
    config_file = directory / deployment.CONFIG_NAME
    if demo_user:
        settings = load_settings(config_file)

        async def admit(store: Store) -> tuple[User, str]:
            return await deployment.admit_demo_user(store, settings.scrypt)

        _migrate(settings.database_url)  # a new deployment's database
        user, password = with_store(config_file, admit)
        typer.echo(f"wrote {deployment.write_demo_user(directory, user, password)}")
        typer.echo(demo_instructions(settings.public_listen, user.id, password))
    typer.echo(f"start it with: agent-gateway serve --config {config_file}")


def _llm_agent(
    agent: str, model: str | None, base_url: str | None, api_key_env: str | None
) -> deployment.LLMAgent | None:
    """The reference LLM agent the options describe, or None for the echo agent; refuses a bad combination."""
    if agent not in ("echo", "llm"):
        raise fail(f"--agent takes echo or llm (got {agent!r})")
    if agent == "echo":
        given = [name for name, value in (("--model", model), ("--base-url", base_url),
                                          ("--api-key-env", api_key_env)) if value is not None]
        if given:
            raise fail(f"{given[0]} is for --agent llm")
        return None
    if model is None:
        raise fail("--agent llm needs --model PROVIDER:MODEL, such as openai:gpt-4o")
    try:
        return deployment.LLMAgent(model, base_url, api_key_env)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _matrix_account(homeserver: str | None, user: str | None, token_stdin: bool) -> deployment.MatrixAccount | None:
    """The Matrix account the options name, its token read from stdin or a hidden prompt; None without them."""
    if homeserver is None and user is None:
        if token_stdin:
            raise fail("--matrix-token-stdin is for --matrix-homeserver and --matrix-user")
        return None
    if homeserver is None or user is None:
        raise fail("give both --matrix-homeserver and --matrix-user")
    if token_stdin:
        token = sys.stdin.read().strip()
    elif sys.stdin.isatty():
        token = typer.prompt("The Matrix account's access token", hide_input=True).strip()
    else:
        raise fail("stdin is not a terminal: pass --matrix-token-stdin to read the access token from it")
    try:
        return deployment.MatrixAccount(homeserver, user, token)
    except ValueError as exc:
        raise fail(str(exc)) from None


def llm_instructions(llm: deployment.LLMAgent) -> str:
    lines = ["The agent is the reference LLM agent: edit its instructions in workspace/instructions.md."]
    if importlib.util.find_spec("pydantic_ai") is None:
        lines.append("It needs the llm extra: pip install -e '.[llm]' in a clone of agent-gateway")
    if llm.key_env is not None and llm.base_url is not None:
        lines.append(f"It sends the API key in ${llm.key_env}, if set there (a local server may need none).")
    elif llm.key_env is not None:
        lines.append(f"It reads its API key from ${llm.key_env}: set it in the environment of agent-gateway serve.")
    return "\n".join(lines)


def demo_instructions(public: object, user_id: str, password: str) -> str:
    base = f"http://{public}"
    return f"""
Demo User {user_id}, password {password}
Once the gateway runs, in another terminal:
  TOKEN=$(curl -s -X POST {base}/auth/tokens -H 'Content-Type: application/json' \\
    -d '{{"user": "{user_id}", "password": "{password}"}}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
  curl -s -X POST {base}/messages -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d '{{"text": "hello"}}'
  curl -s "{base}/messages?after=0" -H "Authorization: Bearer $TOKEN"    # the echo agent's answer
"""


@app.command()
def serve(
    config_path: ConfigOption = None,
    role: Annotated[
        list[str] | None,
        typer.Option(
            help="what this process does: all (default), api (both HTTP servers), worker (the Signal "
            "Worker), scheduler (the Scheduler); repeat or comma-separate to combine",
        ),
    ] = None,
    force: ForceOption = False,
) -> None:
    """Run the gateway until SIGINT or SIGTERM: both HTTP servers and the loops, or the given roles.

    Creates or upgrades the database schema first, as migrate does."""
    from agent_gateway import serving
    from agent_gateway.gateway import ROLES

    roles = {part.strip() for value in (role or ["all"]) for part in value.split(",") if part.strip()}
    if "all" in roles:
        roles = (roles - {"all"}) | set(ROLES)
    if not roles or roles - set(ROLES):
        raise fail(f"--role takes all, {', '.join(ROLES)} (got {', '.join(sorted(roles)) or 'nothing'})")
    settings = load_settings(config_path)
    logs.configure(settings.log_level, settings.log_format)
    try:
        serving.run(settings, frozenset(roles), force=force)
    except Exception as exc:
        problem = common.database_problem(exc)
        if problem is not None:
            raise fail(f"database.url {masked(settings.database_url)}: {problem}") from None
        if isinstance(exc, (errors.GatewayError, OSError)):
            raise fail(str(exc)) from None
        raise


@app.command()
def migrate(config_path: ConfigOption = None, force: ForceOption = False) -> None:
    """Create the database schema, or upgrade it to this version's (serve does it too).

    Refuses a database that has other tables and no gateway schema, unless --force."""
    typer.echo(_migrate(load_settings(config_path).database_url, force=force))


def _migrate(url: str, *, force: bool = False) -> str:
    async def run() -> str:
        migrations.create_sqlite_file(url)
        store = Store(url)
        try:
            return await migrations.migrate(store.engine, force=force)
        finally:
            await store.close()

    return on_database(url, run())


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"agent-gateway {importlib.metadata.version('agent-gateway')}")
        raise typer.Exit()


@app.callback(no_args_is_help=True)
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="print the version and exit", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """A gateway between one shared AI agent and the people it serves."""


def main() -> None:
    """The console script: click's usage errors become one line (exit 2), as every error is."""
    try:
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        code = 2
    except click_errors.UsageError as exc:
        typer.echo(f"agent-gateway: error: {' '.join(exc.format_message().split())}", err=True)
        code = 2
    except click_errors.ClickException as exc:
        typer.echo(f"agent-gateway: error: {' '.join(exc.format_message().split())}", err=True)
        code = exc.exit_code
    except typer.Abort:
        typer.echo("agent-gateway: error: aborted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)
