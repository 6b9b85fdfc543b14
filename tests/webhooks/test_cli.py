"""``agent-gateway webhooks deliveries`` and ``webhooks retry``, beside a running gateway, on both backends."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from pathlib import Path

import orjson
import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from tests import served
from tests.webhooks.conftest import endpoint, with_endpoints
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_delivery import stored, until

pytestmark = pytest.mark.processes


def cli(tmp_path: Path, database_url: str, *args: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "cli.toml"
    path.write_text(f'[auth]\ntoken_ttl_ms = 1000\n[database]\nurl = "{database_url}"\n')
    return asyncio.to_thread(served.run_cli, *args, config=path)


async def test_deliveries_and_retry(settings: config.Settings, receiver: Receiver, tmp_path: Path) -> None:
    receiver.fail_first = 1_000_000
    hooked = with_endpoints(settings, endpoint(receiver, ("decision.published",)))
    gateway = Gateway(dataclasses.replace(hooked, webhook_retry_for=datetime.timedelta(seconds=1)))
    await gateway.start()
    try:
        await gateway.publisher.publish("first")
        [dead] = await until(lambda: stored(gateway, "dead"))
        listed = await cli(tmp_path, settings.database_url, "webhooks", "deliveries", "--state", "dead")
        assert listed.returncode == 0, listed.stderr
        [shown] = orjson.loads(listed.stdout)
        assert shown == {
            "id": dead.id, "url": receiver.url, "event": "decision.published", "state": "dead",
            "attempts": dead.attempts, "createdAt": dead.created_at, "nextAttemptAt": None,
            "lastError": "HTTP 500", "deliveredAt": None,
        }
        empty = await cli(tmp_path, settings.database_url, "webhooks", "deliveries", "--state", "pending")
        assert (empty.returncode, orjson.loads(empty.stdout)) == (0, [])

        # Retried, it is sent at once: the command wakes the gateway's deliverer.
        receiver.fail_first = 0
        retried = await cli(tmp_path, settings.database_url, "webhooks", "retry", dead.id)
        assert retried.returncode == 0, retried.stderr
        assert orjson.loads(retried.stdout)["state"] == "pending"
        accepted = await asyncio.to_thread(receiver.wait_for, 1)
        assert [r.id for r in accepted] == [dead.id]
        [delivered] = await until(lambda: stored(gateway, "delivered"))
        assert delivered.id == dead.id

        again = await cli(tmp_path, settings.database_url, "webhooks", "retry", dead.id)
        assert again.returncode == 1 and again.stdout == ""
        assert again.stderr == (
            f"agent-gateway: error: delivery {dead.id} is delivered; only a failed or dead delivery can be retried\n"
        )
        nobody = str(uuid.uuid4())
        absent = await cli(tmp_path, settings.database_url, "webhooks", "retry", nobody)
        assert (absent.returncode, absent.stderr) == (1, f"agent-gateway: error: no webhook delivery has the id {nobody}\n")
        malformed = await cli(tmp_path, settings.database_url, "webhooks", "retry", "not-an-id")
        assert malformed.returncode == 1 and malformed.stderr.startswith("agent-gateway: error: id") and "\n" == malformed.stderr[-1]
        assert malformed.stderr.count("\n") == 1
        state = await cli(tmp_path, settings.database_url, "webhooks", "deliveries", "--state", "lost")
        assert state.returncode == 2 and state.stderr.count("\n") == 1
        # Nothing the refusals touched changed.
        assert [(d.id, d.state) for d in await stored(gateway)] == [(dead.id, "delivered")]
    finally:
        await gateway.stop()
