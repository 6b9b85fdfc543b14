"""The quickstart's path end to end: ``init`` + ``serve``, an inbound Message, the echo agent's answer."""

from __future__ import annotations

import httpx
import pytest

from agent_gateway.messages import service as messages
from agent_gateway.store.engine import Store

from tests import served
from tests.signals.conftest import until

pytestmark = pytest.mark.e2e


async def test_the_echo_agent_answers_an_inbound_message(served_gateway: served.ServedGateway, database_url: str) -> None:
    user = served_gateway.cli_json("users", "add")["id"]
    store = Store(database_url)
    try:
        # What POST /messages on the Public server does: the Message and its Signal, one transaction.
        async with store.transaction() as conn:
            inbound = await messages.receive(conn, user, "hello, agent")
    finally:
        await store.close()

    async with httpx.AsyncClient(base_url=served_gateway.agent_url) as agent:

        async def answered() -> bool:
            # The answer is posted while the Run is still running: wait for the Signal to end too.
            signals = (await agent.get("/signals", params={"kind": "message.received"})).json()["signals"]
            return bool(signals) and signals[0]["state"] in ("done", "failed")

        await until(answered)
        log = (await agent.get("/messages", params={"user": user})).json()["messages"]
        [signal] = (await agent.get("/signals", params={"kind": "message.received"})).json()["signals"]
        [run] = (await agent.get("/runs", params={"signalId": signal["id"]})).json()["runs"]

    assert [(m["direction"], m["seq"], m["text"]) for m in log] == [
        ("inbound", 1, "hello, agent"),
        ("outbound", 2, "echo: hello, agent"),
    ]
    assert signal["payload"] == inbound.to_json()
    assert (signal["state"], signal["error"]) == ("done", None)
    assert (run["state"], run["session"]) == ("done", f"user_{user}")
    assert run["prompt"] == f"A message from user {user}:\n\nhello, agent"
    assert "hello, agent" not in served_gateway.output()
