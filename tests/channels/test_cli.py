"""``agent-gateway pairing``, ``users link|unlink|identities`` and ``channels deliveries``, on both backends:
what each prints, and each refusal as one line, exit 1, nothing changed."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from agent_gateway.channels import inbound
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import channel_identities, channel_pairings, users
from tests import served
from tests.channels.test_machinery import ALICE, linked, rows, text
from tests.terminal import Terminal

pytestmark = pytest.mark.processes


def cli(tmp_path: Path, database_url: str, *args: str, here: bool = False):  # type: ignore[no-untyped-def]
    """The command in a process of its own, or in this process (``served.run_cli_here``, in a
    thread: this test's event loop runs here) with ``here``."""
    path = tmp_path / "cli.toml"
    path.write_text(f'[auth]\ntoken_ttl_ms = 1000\n[database]\nurl = "{database_url}"\n')
    return asyncio.to_thread(served.run_cli_here if here else served.run_cli, *args, config=path)


async def snapshot(store: Store) -> list[list[tuple]]:
    return [
        sorted(tuple(row) for row in await rows(store, table)) for table in (users, channel_identities, channel_pairings)
    ]


async def refused(tmp_path: Path, store: Store, args: tuple[str, ...], line: str) -> None:
    before = await snapshot(store)
    result = await cli(tmp_path, store.url, *args, here=True)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"agent-gateway: error: {line}\n"), args
    assert await snapshot(store) == before, args


async def test_pairing_commands(store: Store, tmp_path: Path) -> None:
    await inbound.record(store, "matrix", inbound.PAIRING, [text(), text("@bob:example.org")], "s1")
    listed = await cli(tmp_path, store.url, "pairing", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    requests = orjson.loads(listed.stdout)
    assert [(r["channel"], r["identity"]) for r in requests] == [("matrix", ALICE), ("matrix", "matrix:@bob:example.org")]
    assert all(set(r) == {"code", "channel", "identity", "createdAt", "expiresAt"} for r in requests)
    alice, bob = (r["code"] for r in requests)

    approved = await cli(tmp_path, store.url, "pairing", "approve", alice, "--json")
    assert approved.returncode == 0, approved.stderr
    shown = orjson.loads(approved.stdout)
    assert shown["identity"] == ALICE and uuid.UUID(shown["user"])
    plain = await cli(tmp_path, store.url, "pairing", "approve", bob, "--user", shown["user"])
    assert (plain.returncode, plain.stdout) == (0, shown["user"] + "\n")

    identities = await cli(tmp_path, store.url, "users", "identities", shown["user"], "--json")
    assert [i["identity"] for i in orjson.loads(identities.stdout)] == [ALICE, "matrix:@bob:example.org"]

    await refused(tmp_path, store, ("pairing", "approve", alice), f"no pending pairing request has the code '{alice}'")
    await refused(tmp_path, store, ("pairing", "deny", "ABCDEFGH"), "no pending pairing request has the code 'ABCDEFGH'")
    await inbound.record(store, "matrix", inbound.PAIRING, [text("@carol:example.org")], "s2")
    [carol] = [row.code for row in await rows(store, channel_pairings)]
    nobody = str(uuid.uuid4())
    await refused(tmp_path, store, ("pairing", "approve", carol, "--user", nobody), f"no User has the id {nobody}")
    await refused(
        tmp_path, store, ("pairing", "approve", carol, "--user", "not-a-user"),
        "--user must be a UUID",
    )
    # Linked by the operator meanwhile: approving would admit a User for nothing, or link twice.
    holder = await linked(store, "matrix:@carol:example.org")
    for extra in ((), ("--user", shown["user"])):
        await refused(
            tmp_path, store, ("pairing", "approve", carol, *extra),
            "matrix:@carol:example.org is already linked to another User",
        )
    assert [row.user_id for row in await rows(store, channel_identities) if row.identity.endswith("carol:example.org")] == [holder]
    denied = await cli(tmp_path, store.url, "pairing", "deny", carol)
    assert denied.returncode == 0 and await rows(store, channel_pairings) == []


async def test_link_commands_and_their_refusals(store: Store, tmp_path: Path) -> None:
    holder = await linked(store)
    other = await linked(store, "matrix:@bob:example.org")
    nobody = str(uuid.uuid4())
    await refused(tmp_path, store, ("users", "link", other, ALICE), f"{ALICE} is already linked to another User")
    await refused(tmp_path, store, ("users", "link", holder, ALICE), f"{ALICE} is already linked to this User")
    await refused(
        tmp_path, store, ("users", "link", other, "alice"),
        "'alice' is not an identity: write <channel>:<address> with a channel of matrix, nostr (such as matrix:@alice:example.org)",
    )
    await refused(
        tmp_path, store, ("users", "link", other, "matrix:alice"),
        "'matrix:alice' is not an identity: 'alice' is not a matrix address",
    )
    await refused(tmp_path, store, ("users", "link", nobody, "matrix:@carol:example.org"), f"no User has the id {nobody}")
    await refused(tmp_path, store, ("users", "unlink", other, ALICE), f"{ALICE} is not linked to User {other}")
    await refused(tmp_path, store, ("users", "identities", nobody), f"no User has the id {nobody}")

    linking = await cli(tmp_path, store.url, "users", "link", other, "matrix:@carol:example.org")
    assert linking.returncode == 0, linking.stderr
    unlinking = await cli(tmp_path, store.url, "users", "unlink", holder, ALICE)
    assert unlinking.returncode == 0, unlinking.stderr
    listed = await cli(tmp_path, store.url, "users", "identities", other)
    assert listed.stdout.splitlines() == sorted(["matrix:@bob:example.org", "matrix:@carol:example.org"])


async def test_channel_deliveries(store: Store, tmp_path: Path) -> None:
    await inbound.record(store, "matrix", inbound.PAIRING, [text(words="secret words")], "s1")
    listed = await cli(tmp_path, store.url, "channels", "deliveries")
    assert listed.returncode == 0, listed.stderr
    [delivery] = orjson.loads(listed.stdout)
    assert (delivery["kind"], delivery["state"], delivery["identity"]) == ("notice", "pending", ALICE)
    assert "secret words" not in listed.stdout
    dead = await cli(tmp_path, store.url, "channels", "deliveries", "--state", "dead")
    assert (dead.returncode, orjson.loads(dead.stdout)) == (0, [])
    wrong = await cli(tmp_path, store.url, "channels", "deliveries", "--state", "lost")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1


def test_init_writes_the_matrix_table_and_the_token_file(tmp_path: Path) -> None:
    from agent_gateway import config

    token = "syt_secret_token_value"
    result = served.run_cli(
        "init", str(tmp_path / "d"), "--matrix-homeserver", "https://matrix.example.org/",
        "--matrix-user", "@agent:example.org", "--matrix-token-stdin", config=tmp_path / "none.toml", input=token + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert token not in result.stdout + result.stderr
    token_file = tmp_path / "d" / "matrix-token"
    assert token_file.read_text().strip() == token and token_file.stat().st_mode & 0o777 == 0o600
    assert token not in (tmp_path / "d" / "gateway.toml").read_text()
    settings = config.load(tmp_path / "d" / "gateway.toml", environ={})
    assert (settings.matrix_homeserver, settings.matrix_user_id, settings.matrix_policy) == (
        "https://matrix.example.org", "@agent:example.org", "pairing"
    )
    assert settings.matrix_access_token_file == token_file


def test_init_asks_for_the_matrix_token_at_a_hidden_prompt(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    token = "syt_typed_at_the_prompt"
    terminal = Terminal(
        [sys.executable, "-m", "agent_gateway", "init", str(tmp_path / "d"), "--matrix-homeserver",
         "https://matrix.example.org", "--matrix-user", "@agent:example.org"],
        env=served.cli_env(tmp_path / "none.toml"),
    )
    request.addfinalizer(terminal.close)
    # click writes the prompt, then getpass the space once echo is off: typing before it could be lost.
    terminal.expect("The Matrix account's access token: ")
    terminal.send(token)
    assert terminal.wait() == 0, terminal.output
    assert token not in terminal.output  # the prompt hides what is typed
    assert (tmp_path / "d" / "matrix-token").read_text().strip() == token


def test_init_without_a_terminal_asks_for_matrix_token_stdin(tmp_path: Path) -> None:
    result = served.run_cli(
        "init", str(tmp_path / "d"), "--matrix-homeserver", "https://matrix.example.org",
        "--matrix-user", "@agent:example.org", config=tmp_path / "none.toml", input="",
    )
    assert (result.returncode, result.stderr) == (
        1, "agent-gateway: error: stdin is not a terminal: pass --matrix-token-stdin to read the access token from it\n"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (("--matrix-homeserver", "https://m.example.org"), "give both --matrix-homeserver and --matrix-user"),
        (("--matrix-homeserver", "ftp://m", "--matrix-user", "@a:m.org", "--matrix-token-stdin"),
         "--matrix-homeserver must be the http:// or https:// base URL of the homeserver's client-server API, without credentials"),
        (("--matrix-homeserver", "https://m.example.org", "--matrix-user", "agent", "--matrix-token-stdin"),
         '--matrix-user must be a Matrix user ID, such as "@agent:example.org"'),
        (("--matrix-token-stdin",), "--matrix-token-stdin is for --matrix-homeserver and --matrix-user"),
    ],
)
def test_init_refuses_a_bad_matrix_account(tmp_path: Path, options: tuple[str, ...], line: str) -> None:
    result = served.run_cli("init", str(tmp_path / "d"), *options, config=tmp_path / "none.toml", input="tok\n")
    assert (result.returncode, result.stderr) == (1, f"agent-gateway: error: {line}\n")
    assert not (tmp_path / "d").exists()
