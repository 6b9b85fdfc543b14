"""``agent-gateway chat`` end to end: a real ``serve`` with the demo echo agent, the
client in a pseudo-terminal, typed into as a person would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_gateway.store.engine import Store
from agent_gateway.store.tables import tokens
from tests import served
from tests.terminal import Terminal

pytestmark = [pytest.mark.processes, pytest.mark.e2e]


async def live_tokens(database_url: str, user_id: str) -> int:
    store = Store(database_url)
    try:
        async with store.read() as conn:
            query = sa.select(sa.func.count()).select_from(tokens).where(tokens.c.user_id == user_id)
            return (await conn.execute(query)).scalar_one()
    finally:
        await store.close()


def chat_terminal(gateway: served.ServedGateway, *args: str) -> Terminal:
    env = served.cli_env(gateway.config, {"TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"})
    return Terminal([sys.executable, "-m", "agent_gateway", "chat", gateway.public_url, *args], env)


async def test_a_user_chats_with_the_echo_agent_and_leaves(tmp_path: Path, database_url: str) -> None:
    directory = tmp_path / "demo"
    env, _ = served.init_demo(directory, database_url)
    credentials = json.loads((directory / "demo-user.json").read_text())
    # Ports of its own, picked again should another test take one meanwhile; kept for the restart.
    gateway = served.ServedGateway.spawn_on_free_ports(directory, env)
    try:
        terminal = chat_terminal(gateway, "--user", credentials["user"])
        try:
            terminal.expect("Password:")
            terminal.send(credentials["password"])
            terminal.expect("logged in as")
            terminal.expect(">")
            terminal.send("hello over the stream")
            terminal.expect("you: hello over the stream")
            terminal.expect("agent: echo: hello over the stream")
            assert await live_tokens(database_url, credentials["user"]) == 1
            # The gateway restarts: the client reconnects and resumes after the last seq it showed.
            assert gateway.stop() == 0
            terminal.expect("(connection lost")
            gateway = served.ServedGateway.spawn(directory, gateway.env)
            terminal.send("after the restart")
            terminal.expect("agent: echo: after the restart")
            assert terminal.output.count("agent: echo: hello over the stream") == 1
            terminal.send("/quit")
            terminal.expect("(logged out)")
            assert terminal.wait() == 0
        finally:
            terminal.close()
        # Typed without echo: the password never showed on the terminal.
        assert credentials["password"] not in terminal.output
        assert await live_tokens(database_url, credentials["user"]) == 0

        # Again, leaving with Ctrl-C: the recent conversation is shown first.
        terminal = chat_terminal(gateway, "--user", credentials["user"])
        try:
            terminal.expect("Password:")
            terminal.send(credentials["password"])
            terminal.expect("agent: echo: hello over the stream")
            terminal.expect("logged in as")
            terminal.expect(">")  # the editor is up (a Ctrl-C typed before it is the terminal's)
            terminal.send("\x03")
            terminal.expect("(logged out)")
            assert terminal.wait() == 0
        finally:
            terminal.close()
        assert await live_tokens(database_url, credentials["user"]) == 0
    finally:
        assert gateway.stop() == 0


def test_a_wrong_password_is_one_line_and_exit_1(served_gateway: served.ServedGateway) -> None:
    user = served_gateway.cli_json("users", "add")
    result = served.run_cli(
        "chat", served_gateway.public_url, "--user", user["id"], "--password-stdin",
        config=served_gateway.config, input="not the password\n",
    )
    assert result.returncode == 1
    assert "logging in failed: authentication failed" in result.stderr
