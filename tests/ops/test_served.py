"""A real ``serve``: its ops listener, its logs in both formats (no secret in any line), and
metrics shared by several HTTP processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests import served
from tests.ops.conftest import drop, readyz, until_ready, value

pytestmark = pytest.mark.e2e

ANSWER_DEADLINE_S = 300  # a ceiling for a broken build
PASSWORD = "correct horse battery staple 7"
STATEMENT = "the statement nobody may log 42"
DECISION = "the decision nobody may log 43"
TEXT = "a message nobody may log 44"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    # serve migrates a fresh database itself; these cases do not depend on the backend.
    return f"sqlite:///{tmp_path / 'gateway.db'}"


async def _answer(client: httpx.AsyncClient, auth: dict[str, str], after: int) -> list[dict]:
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    while time.monotonic() < deadline:
        page = await client.get("/messages", params={"after": str(after)}, headers=auth)
        if page.json()["messages"]:
            return page.json()["messages"]
        await asyncio.sleep(0.05)
    raise TimeoutError("the echo agent never answered")


async def _scrape_until(ops: httpx.AsyncClient, condition: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    while time.monotonic() < deadline:
        text = (await ops.get("/metrics")).text
        if condition(text):
            return text
        await asyncio.sleep(0.05)
    raise TimeoutError("the metrics never showed it")


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_logs_hold_no_secret_and_metrics_follow_the_work(tmp_path: Path, database_url: str, log_format: str) -> None:
    env = {"AGENT_GATEWAY_LOG_FORMAT": log_format, "AGENT_GATEWAY_LOG_ACCESS": "true", "AGENT_GATEWAY_LOG_LEVEL": "DEBUG"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        assert gateway.ops_url is not None
        user = gateway.cli_json("users", "add")
        set_password = gateway.cli("users", "set-password", user["id"], "--password-stdin", input=PASSWORD)
        assert set_password.returncode == 0, set_password.stderr
        async with (
            httpx.AsyncClient(base_url=gateway.public_url, timeout=120) as public,
            httpx.AsyncClient(base_url=gateway.agent_url, timeout=120) as agent,
            httpx.AsyncClient(base_url=gateway.ops_url, timeout=120) as ops,
        ):
            assert (await ops.get("/healthz")).json() == {"status": "ok"}
            ready = await until_ready(ops)
            assert ready.status_code == 200, ready.text
            before = (await ops.get("/metrics")).text

            login = await public.post("/auth/tokens", json={"user": user["id"], "password": PASSWORD})
            assert login.status_code == 201, login.text
            token = login.json()["token"]
            auth = {"Authorization": f"Bearer {token}"}
            assert (await public.get("/users/me", headers=auth)).status_code == 200
            assert (await public.get("/users/me", params={"token": token})).status_code == 400
            assert (await agent.post("/sign", json={"statement": STATEMENT})).status_code == 200
            assert (await agent.post("/decisions", json={"statement": DECISION})).status_code == 201
            sent = await public.post("/messages", json={"text": TEXT}, headers=auth)
            assert sent.status_code == 201
            await _answer(public, auth, sent.json()["seq"])

            # The echo agent answers during its Run: wait for the Run to end.
            after = await _scrape_until(ops, lambda text: value(text, "agent_gateway_runs_total", state="done") >= 1)
            assert value(before, "agent_gateway_runs_total", state="done") == 0
            assert value(after, "agent_gateway_run_duration_seconds_count") >= 1
            assert value(after, "agent_gateway_messages_total", direction="inbound") == 1
            assert value(after, "agent_gateway_messages_total", direction="outbound") == 1
            assert value(after, "agent_gateway_decisions_total") == 1
            assert value(after, "agent_gateway_worker_leader") == 1
            assert value(after, "agent_gateway_http_requests_total", server="public", route="/auth/tokens", method="POST", status="201") == 1
            for secret in (PASSWORD, token, STATEMENT, DECISION, TEXT):
                assert secret not in after
        assert gateway.stop() == 0

    log = gateway.output()
    for secret in (PASSWORD, token, STATEMENT, DECISION, TEXT):
        assert secret not in log, f"{secret!r} is in the log"
    lines = [line for line in log.splitlines() if line.strip()]
    if log_format == "json":
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        assert all({"time", "level", "logger", "message"} <= set(record) for record in records)
        access = [record for record in records if record["logger"] == "agent_gateway.access"]
        assert {"server": "public", "method": "POST", "route": "/auth/tokens", "status": 201} in [
            {key: record[key] for key in ("server", "method", "route", "status")} for record in access
        ]
        assert all(isinstance(record["duration_ms"], float) and record["bytes"] >= 0 for record in access)
        ended = [record for record in records if record.get("action") == "end_run"]
        assert ended and ended[0]["status"] == "done" and {"run", "signal", "duration_ms"} <= set(ended[0])
    else:
        assert any(" agent_gateway.access: public GET /users/me 200 " in line for line in lines)
        assert any(" agent_gateway.access: agent POST /decisions 201 " in line for line in lines)


def test_access_log_off_by_default_in_text(tmp_path: Path, sqlite_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", sqlite_url) as gateway:
        assert httpx.get(f"{gateway.agent_url}/users", timeout=120).status_code == 200
        assert httpx.get(f"{gateway.ops_url}/healthz", timeout=120).status_code == 200
        assert gateway.stop() == 0
    assert "agent_gateway.access" not in gateway.output()
    assert "ops listener (/healthz, /readyz, /metrics) on http://" in gateway.output()


def test_several_http_processes_share_their_counts(tmp_path: Path, database_url: str) -> None:
    requests = 60
    with served.ServedGateway.start(tmp_path / "deployment", database_url, {"AGENT_GATEWAY_HTTP_WORKERS": "3"}) as gateway:
        for _ in range(requests):  # a connection each, so the kernel spreads them over the processes
            assert httpx.get(f"{gateway.agent_url}/users", timeout=120).status_code == 200
        # Each process moves its counts into the shared files within a second (ops.observe).
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while True:
            text = httpx.get(f"{gateway.ops_url}/metrics", timeout=120).text
            counted = value(text, "agent_gateway_http_requests_total", server="agent", route="/users", method="GET", status="200")
            if counted == requests or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert counted == requests


async def test_readiness_fails_when_the_postgresql_database_is_dropped(tmp_path: Path, postgresql_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", postgresql_url) as gateway:
        async with httpx.AsyncClient(base_url=gateway.ops_url, timeout=120) as ops:
            ready = await until_ready(ops)
            assert ready.status_code == 200, ready.text
            await drop(postgresql_url)
            response = await readyz(ops)
            assert response.status_code == 503
            assert response.json()["status"] == "not ready"
            assert response.json()["checks"]["database"].startswith("unavailable: ")
            assert (await ops.get("/healthz")).status_code == 200  # alive, not ready
            assert (await ops.get("/metrics")).status_code == 200


def test_ops_listener_off(tmp_path: Path, sqlite_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", sqlite_url, {"AGENT_GATEWAY_OPS_LISTEN": ""}) as gateway:
        assert gateway.ops_url is None
        assert httpx.get(f"{gateway.agent_url}/users", timeout=120).status_code == 200
        assert gateway.stop() == 0
    assert "ops listener" not in gateway.output()


def test_an_ops_listener_off_loopback_is_warned_about(tmp_path: Path, sqlite_url: str) -> None:
    listen = f"0.0.0.0:{served.free_port()}"
    with served.ServedGateway.start(tmp_path / "deployment", sqlite_url, {"AGENT_GATEWAY_OPS_LISTEN": listen}) as gateway:
        assert httpx.get(f"http://127.0.0.1:{listen.rpartition(':')[2]}/healthz", timeout=120).status_code == 200
        assert gateway.stop() == 0
    assert f"ops listener binds {listen}, which is not loopback" in gateway.output()
