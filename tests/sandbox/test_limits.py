"""The confined agent's limits: a program that forks without bound, or allocates without bound,
fails its Run, and the gateway answers throughout (and the agent's next Run); per-run and persistent,
on both backends. The limits are set low here (64 processes, 256 MiB) so a Run meets them quickly."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests import served
from tests.sandbox.conftest import Conversation, agent_env

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("bwrap")]

MAX_PROCESSES = 64
MEMORY_LIMIT_MB = 256


@pytest.mark.parametrize("mode", ["per-run", "persistent"])
def test_a_fork_bomb_and_a_memory_hog_fail_their_runs_while_the_gateway_answers(
    database_url: str, tmp_path: Path, mode: str
) -> None:
    env = agent_env(
        "trying_agent.py", mode, max_processes=str(MAX_PROCESSES), memory_limit_mb=str(MEMORY_LIMIT_MB)
    )
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        conversation = Conversation(gateway)

        conversation.say("fork")
        run = conversation.last_run()
        assert run["state"] == "failed"
        forked = re.search(r"fork refused after (\d+) processes", run["error"])
        assert forked is not None, run["error"]
        assert int(forked[1]) < MAX_PROCESSES
        assert httpx.get(f"{gateway.public_url}/openapi.json").status_code == 200

        conversation.say("memory")
        run = conversation.last_run()
        assert run["state"] == "failed"
        allocated = re.search(r"allocation refused after (\d+) MiB", run["error"])
        assert allocated is not None, run["error"]
        assert int(allocated[1]) < MEMORY_LIMIT_MB
        assert httpx.get(f"{gateway.public_url}/openapi.json").status_code == 200

        conversation.say("hello")
        assert conversation.answer() == "hello"
