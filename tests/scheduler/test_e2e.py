"""End to end with the real clock: a running ``agent-gateway serve`` fires a Schedule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_gateway import clock
from agent_gateway.store.engine import Store

from tests import served
from tests.scheduler.conftest import fired

pytestmark = pytest.mark.e2e

# Only a wake-up can make the fire prompt: the timer's own sweep is an hour away.
ENV = {"AGENT_GATEWAY_SCHEDULER_MAX_SLEEP_MS": "3600000"}
PATIENCE_S = 300


@pytest.fixture
def gateway(tmp_path: Path, database_url: str) -> Iterator[served.ServedGateway]:
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env=ENV) as gateway:
        yield gateway


async def wait_for_fires(database_url: str, count: int) -> list[dict[str, Any]]:
    store = Store(database_url)
    try:
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            payloads = await fired(store)
            if len(payloads) >= count:
                return payloads
            await asyncio.sleep(0.05)
        raise AssertionError(f"fewer than {count} Schedule fires within {PATIENCE_S}s")
    finally:
        await store.close()


async def test_a_once_schedule_fires_through_a_running_gateway(
    gateway: served.ServedGateway, database_url: str
) -> None:
    at = clock.format_instant(clock.now() + timedelta(seconds=5))
    # The client waits about as long as the server keeps an idle connection (http.idle_timeout_ms,
    # 5 s): it must not reuse one the server may be closing at that moment (httpx's default
    # expiry is those same 5 s), so it drops its own idle connections well before.
    async with httpx.AsyncClient(base_url=gateway.agent_url, limits=httpx.Limits(keepalive_expiry=1)) as agent:
        response = await agent.put(
            "/schedules/e2e-once", json={"spec": {"kind": "once", "at": at}, "data": {"hello": "world"}}
        )
        assert response.status_code == 201, response.text
        assert (await agent.get("/schedules")).json()["schedules"] == [response.json()]

        [payload] = await wait_for_fires(database_url, 1)
        assert payload["scheduleName"] == "e2e-once"
        assert payload["scheduledFor"] == at
        assert payload["data"] == {"hello": "world"}
        assert clock.parse_instant(payload["firedAt"]) >= clock.parse_instant(at)
        assert (await agent.get("/schedules")).json() == {"schedules": []}
        assert (await agent.get("/schedules/e2e-once")).status_code == 404


async def test_operator_and_agent_share_one_namespace(gateway: served.ServedGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.agent_url) as agent:
        await agent.put("/schedules/shared", json={"spec": {"kind": "cron", "expr": "0 9 * * *", "tz": "Asia/Tokyo"}})
        shown = gateway.cli_json("schedules", "show", "shared")
        assert shown == (await agent.get("/schedules/shared")).json()

        replaced = gateway.cli_json("schedules", "put", "shared", "--cron", "@hourly", "--data", '{"from": "operator"}')
        assert replaced["data"] == {"from": "operator"}
        assert (await agent.get("/schedules/shared")).json() == replaced

        assert gateway.cli("schedules", "delete", "shared").returncode == 0
        assert (await agent.get("/schedules/shared")).status_code == 404
