"""The working loop as a newcomer meets it: ``init --demo-user``, ``serve``, log in, post, read the answer.

Real processes on real sockets: the gateway, and the demo echo agent it starts
for the Run. Nothing here reaches into the database.
"""

from __future__ import annotations

import asyncio
import json
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests import served

pytestmark = pytest.mark.e2e

ANSWER_DEADLINE_S = 300  # a ceiling for a broken build; the time taken is printed


async def test_a_newcomer_logs_in_posts_and_reads_the_agents_answer(tmp_path: Path, database_url: str) -> None:
    directory = tmp_path / "demo"
    env, init = served.init_demo(directory, database_url)
    credentials_file = directory / "demo-user.json"
    assert stat.S_IMODE(credentials_file.stat().st_mode) == 0o600
    credentials = json.loads(credentials_file.read_text())
    # The newcomer is told who they are and how to log in.
    assert credentials["user"] in init.stdout and credentials["password"] in init.stdout
    assert f"http://{env['AGENT_GATEWAY_PUBLIC_LISTEN']}/auth/tokens" in init.stdout

    gateway = served.ServedGateway.spawn_on_free_ports(directory, env)
    try:
        async with httpx.AsyncClient(base_url=gateway.public_url, timeout=120) as client:
            login = await client.post("/auth/tokens", json=credentials)
            assert login.status_code == 201, login.text
            assert login.json()["user"]["id"] == credentials["user"]
            auth = {"Authorization": f"Bearer {login.json()['token']}"}

            sent = await client.post("/messages", json={"text": "hello, agent"}, headers=auth)
            assert sent.status_code == 201, sent.text
            inbound = sent.json()
            assert (inbound["direction"], inbound["seq"], inbound["text"]) == ("inbound", 1, "hello, agent")
            posted = time.monotonic()

            answers: list[dict] = []
            while not answers:
                assert time.monotonic() - posted < ANSWER_DEADLINE_S, gateway.output()
                await asyncio.sleep(0.05)
                page = await client.get("/messages", params={"after": str(inbound["seq"])}, headers=auth)
                assert page.status_code == 200
                answers = page.json()["messages"]
            print(f"answer readable {1000 * (time.monotonic() - posted):.0f} ms after the POST")

        [answer] = answers
        assert answer["direction"] == "outbound"
        assert answer["seq"] == 2
        assert answer["userId"] == credentials["user"]
        assert answer["text"] == "echo: hello, agent"
    finally:
        assert gateway.stop() == 0
    # Neither the password, the Token nor the Message text reaches the log.
    log = gateway.output()
    assert credentials["password"] not in log
    assert login.json()["token"] not in log
    assert "hello, agent" not in log
