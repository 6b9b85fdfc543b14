"""``agent-gateway users set-password`` and ``agent-gateway tokens issue|revoke``, against a real serve."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from agent_gateway.cli.main import app

from tests.served import ServedGateway, cli_env, run_cli
from tests.terminal import Terminal

pytestmark = pytest.mark.processes

UNKNOWN_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"


def login(gateway: ServedGateway, user_id: str, password: str) -> httpx.Response:
    return httpx.post(f"{gateway.public_url}/auth/tokens", json={"user": user_id, "password": password})


def me(gateway: ServedGateway, token: str) -> httpx.Response:
    return httpx.get(f"{gateway.public_url}/users/me", headers={"Authorization": f"Bearer {token}"})


@pytest.mark.e2e
def test_an_operator_gives_access_and_takes_it_back(shared_gateway: ServedGateway):
    gateway = shared_gateway
    user = gateway.cli_json("users", "add")
    assert login(gateway, user["id"], "from stdin").status_code == 401

    # The password comes from stdin; one final newline is not part of it.
    result = gateway.cli("users", "set-password", user["id"], "--password-stdin", input="from stdin\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "from stdin" not in result.stderr
    logged_in = login(gateway, user["id"], "from stdin")
    assert logged_in.status_code == 201
    assert logged_in.json()["user"] == user

    issued = gateway.cli_json("tokens", "issue", user["id"])
    assert set(issued) == {"token", "expiresAt", "user"} and issued["user"] == user
    assert me(gateway, issued["token"]).json() == user

    # Setting a password revokes nothing.
    result = gateway.cli("users", "set-password", user["id"], "--password-stdin", input="second\r\n")
    assert result.returncode == 0, result.stderr
    assert me(gateway, logged_in.json()["token"]).status_code == 200
    assert login(gateway, user["id"], "from stdin").status_code == 401
    assert login(gateway, user["id"], "second").status_code == 201

    for _ in range(2):  # idempotent
        result = gateway.cli("tokens", "revoke", user["id"])
        assert result.returncode == 0, result.stderr
    assert me(gateway, issued["token"]).status_code == 401
    assert me(gateway, logged_in.json()["token"]).status_code == 401
    assert "from stdin" not in gateway.output() and issued["token"] not in gateway.output()


@pytest.mark.e2e
def test_cli_refusals(shared_gateway: ServedGateway):
    gateway = shared_gateway
    user = gateway.cli_json("users", "add")

    # Never from argv: there is no such argument.
    result = gateway.cli("users", "set-password", user["id"], "on-the-command-line")
    assert result.returncode != 0
    assert login(gateway, user["id"], "on-the-command-line").status_code == 401

    for args, stdin, message in [
        (("users", "set-password", user["id"], "--password-stdin"), "", "the password is empty"),
        (("users", "set-password", user["id"], "--password-stdin"), "\n", "the password is empty"),
        (("users", "set-password", UNKNOWN_ID, "--password-stdin"), "pw", "No User has that id."),
        (("users", "set-password", "not-a-uuid", "--password-stdin"), "pw", "id must be a UUID"),
        (("tokens", "issue", UNKNOWN_ID), None, "No User has that id."),
        (("tokens", "issue", "not-a-uuid"), None, "id must be a UUID"),
        (("tokens", "revoke", "not-a-uuid"), None, "id must be a UUID"),
    ]:
        result = gateway.cli_here(*args, input=stdin)
        assert result.returncode == 1, args
        assert result.stderr == f"agent-gateway: error: {message}\n", args
    assert login(gateway, user["id"], "pw").status_code == 401
    # Revoking the Tokens of an id nobody holds is not an error: there are none.
    assert gateway.cli("tokens", "revoke", UNKNOWN_ID).returncode == 0


@pytest.mark.e2e
def test_set_password_refuses_stdin_that_is_not_utf8(shared_gateway: ServedGateway):
    import subprocess
    import sys

    from tests.served import cli_env

    user = shared_gateway.cli_json("users", "add")
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "users", "set-password", user["id"], "--password-stdin"],
        env=cli_env(shared_gateway.config, shared_gateway.env),
        input=b"\xff\xfe",
        capture_output=True,
        timeout=600,
    )
    assert result.returncode == 1
    assert result.stderr == b"agent-gateway: error: the password on stdin is not UTF-8 text\n"


def test_set_password_at_a_prompt_asks_twice(tmp_path: Path, database_url: str, request: pytest.FixtureRequest):
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[database]\nurl = "{database_url}"\n[auth]\ntoken_ttl_ms = 60000\nscrypt = {{ logN = 4 }}\n'
    )
    assert run_cli("migrate", config=config).returncode == 0
    runner = CliRunner()
    added = runner.invoke(app, ["users", "add", "--config", str(config)])
    assert added.exit_code == 0, added.output
    user_id = orjson.loads(added.stdout)["id"]

    def at_a_terminal(first: str, second: str) -> Terminal:
        terminal = Terminal(
            [sys.executable, "-m", "agent_gateway", "users", "set-password", user_id], env=cli_env(config)
        )
        request.addfinalizer(terminal.close)
        # click writes "New password:" and getpass then the space, once it has turned echo off
        # and flushed the terminal's input: typing before the space could be thrown away.
        terminal.expect("New password: ")
        terminal.send(first)
        terminal.expect("Repeat for confirmation: ")
        terminal.send(second)
        return terminal

    mismatch = at_a_terminal("one", "two")
    mismatch.expect("Error: The two entered values do not match.")
    mismatch.process.kill()

    typed = at_a_terminal("typed secret", "typed secret")
    assert typed.wait() == 0, typed.output
    assert f"password set for User {user_id}" in typed.output
    assert "typed secret" not in typed.output  # the prompt hides what is typed

    issued = runner.invoke(app, ["tokens", "issue", user_id, "--config", str(config)])
    assert issued.exit_code == 0
    assert orjson.loads(issued.stdout)["user"]["id"] == user_id
