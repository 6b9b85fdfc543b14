"""Section 4 of issue 26: a hostile agent tries every escape, confined, and each is refused, while
its calls to the Agent server succeed; per-run and persistent, on both backends."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import served
from tests.sandbox.conftest import Conversation, agent_env

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("bwrap")]


@pytest.fixture
def other_loopback() -> Iterator[str]:
    """A listener on another loopback address (127.0.0.2), which an unconfined agent reaches."""
    with socket.create_server(("127.0.0.2", 0)) as listener:
        yield f"127.0.0.2:{listener.getsockname()[1]}"


@pytest.mark.parametrize("mode", ["per-run", "persistent"])
def test_every_escape_is_refused_while_the_agent_server_answers(
    database_url: str, tmp_path: Path, other_loopback: str, mode: str
) -> None:
    deployment = tmp_path / "deployment"
    with served.ServedGateway.start(deployment, database_url, agent_env("hostile_agent.py", mode)) as gateway:
        database = sa.make_url(database_url).database if database_url.startswith("sqlite") else None
        targets = {
            "key": str(deployment / "signing-key.pem"),
            "config": str(deployment / "gateway.toml"),
            "database": database,
            "connect": {
                "the Public server": gateway.env["AGENT_GATEWAY_PUBLIC_LISTEN"],
                "the ops listener": gateway.env["AGENT_GATEWAY_OPS_LISTEN"],
                "PostgreSQL": "127.0.0.1:5432",
                "another loopback address": other_loopback,
            },
            "outside": str(deployment / "escaped.txt"),
            "pid": gateway.process.pid,
            "folder": str(deployment),
        }
        conversation = Conversation(gateway)
        conversation.say(json.dumps(targets))
        escapes = json.loads(conversation.answer())["escapes"]

        assert len(escapes) == 12 - (database is None), escapes
        escaped = {name: outcome for name, outcome in escapes.items() if not outcome.startswith("refused")}
        # Writing into the gateway's folder lands, at most, in the sandbox's own throw-away file system.
        escaped.pop("write outside the Workspace", None)
        assert escaped == {}, escapes
        assert not (deployment / "escaped.txt").exists()
        assert (deployment / "workspace" / "written-by-the-agent").exists()
        assert gateway.process.poll() is None
        assert "runs confined by bubblewrap" in gateway.output()
