"""The ops listener's routes, in process, on both backends: health, readiness, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signals import service as signals
from agent_gateway.users import service as users
from tests.ops.conftest import close_to_connections, readyz, samples, scrape, until_ready, value
from tests.served import free_port


async def test_healthz(ops: httpx.AsyncClient) -> None:
    response = await ops.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_ready_when_the_database_answers_and_every_loop_runs(ops: httpx.AsyncClient) -> None:
    response = await until_ready(ops)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "worker": "ok", "scheduler": "ok"}}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
async def test_the_cross_cutting_rules_hold(ops: httpx.AsyncClient, path: str) -> None:
    response = await ops.get(path, params={"verbose": "1"})
    assert response.status_code == 400 and response.json()["statusCode"] == 400
    assert (await ops.post(path)).status_code == 405
    missing = await ops.get("/signals")
    assert missing.status_code == 404 and missing.json()["error"] == "Not Found"


async def test_not_ready_when_the_signal_worker_stopped(gateway: Gateway, ops: httpx.AsyncClient) -> None:
    await gateway.stop_worker()
    response = await readyz(ops)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["checks"] == {"database": "ok", "worker": "the Signal Worker loop is not running", "scheduler": "ok"}


async def test_not_ready_when_the_schema_is_not_current(gateway: Gateway, ops: httpx.AsyncClient) -> None:
    async with gateway.store.transaction() as conn:
        await conn.execute(sa.text("DROP TABLE alembic_version"))
    response = await readyz(ops)
    assert response.status_code == 503
    assert response.json()["checks"]["database"].startswith("the database schema is not current (none)")


def _unreachable(database_url: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if database_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path}/no-such-folder/gateway.db"
    return f"postgresql://postgres@127.0.0.1:{free_port()}/test"  # nothing listens there


async def test_not_ready_when_the_database_does_not_answer(settings: config.Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    broken = dataclasses.replace(settings, database_url=_unreachable(settings.database_url, tmp_path))
    gateway = Gateway(broken, frozenset({"api"}))  # not started: there is no database to start on
    try:
        assert gateway.ops_app is not None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as ops:
            response = await readyz(ops)
            assert response.status_code == 503
            assert response.json() == {"status": "not ready", "checks": {"database": response.json()["checks"]["database"]}}
            assert response.json()["checks"]["database"].startswith("unavailable: ")
            # Metrics still answer, without the Signals the database would have counted.
            text = await scrape(ops)
            assert "agent_gateway_http_requests_total" in text or "agent_gateway_decisions_total" in text
    finally:
        await gateway.store.close()


# PostgreSQL's alone: an SQLite file cannot be closed to its process (tests/ops/test_served.py drops a
# served gateway's database).
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_not_ready_when_the_postgresql_database_is_closed_to_connections(settings: config.Settings) -> None:
    gateway = Gateway(settings)
    await gateway.start()
    try:
        assert gateway.ops_app is not None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as ops:
            ready = await until_ready(ops)
            assert ready.status_code == 200, ready.text
            await close_to_connections(settings.database_url)
            response = await readyz(ops)
            assert response.status_code == 503 and response.json()["checks"]["database"].startswith("unavailable: ")
    finally:
        await gateway.stop()


async def test_metrics_move_with_requests(
    gateway: Gateway, ops: httpx.AsyncClient, agent: httpx.AsyncClient, public: httpx.AsyncClient
) -> None:
    async with gateway.store.transaction() as conn:
        user = await users.admit(conn)
        await signals.emit(conn, "tick", None)
    before = await scrape(ops)

    # The fast path (a plain JSON POST) and the routes (a path parameter) both count.
    published = await agent.post("/decisions", json={"statement": "counted"})
    assert published.status_code == 201
    seq = published.json()["seq"]
    assert (await agent.get(f"/decisions/{seq}")).status_code == 200
    assert (await agent.get(f"/decisions/{seq + 100}")).status_code == 404
    # The fast path's templated route counts under its template, its refusals too.
    assert (await agent.get(f"/decisions/{seq}/proof")).status_code == 200
    assert (await agent.get(f"/decisions/{seq + 100}/proof")).status_code == 404
    assert (await agent.get("/checkpoint/consistency?from=1")).status_code == 200
    assert (await agent.post("/messages", json={"userId": user.id, "text": "hi"})).status_code == 201
    assert (await agent.get(f"/no/such/{uuid.uuid4()}")).status_code == 404
    assert (await public.get("/users/me")).status_code == 401
    after = await scrape(ops)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "agent_gateway_http_requests_total"
    assert moved(requests, server="agent", route="/decisions", method="POST", status="201") == 1
    assert moved(requests, server="agent", route="/decisions/{seq}", method="GET", status="200") == 1
    assert moved(requests, server="agent", route="/decisions/{seq}", method="GET", status="404") == 1
    assert moved(requests, server="agent", route="unmatched", method="GET", status="404") == 1
    assert moved(requests, server="agent", route="/decisions/{seq}/proof", method="GET", status="200") == 1
    assert moved(requests, server="agent", route="/decisions/{seq}/proof", method="GET", status="404") == 1
    assert moved(requests, server="agent", route="/checkpoint/consistency", method="GET", status="200") == 1
    assert moved(requests, server="public", route="/users/me", method="GET", status="401") == 1
    assert moved("agent_gateway_http_request_duration_seconds_count", server="agent", route="/decisions", method="POST") == 1
    assert moved("agent_gateway_decisions_total") == 1
    assert moved("agent_gateway_messages_total", direction="outbound") == 1
    # Bounded labels only: route templates, never the path of one record, an id or a Statement.
    # (The registry is the process's: series that other tests moved before are left out.)
    earlier = samples(before)
    routes = {
        dict(labels)["route"]
        for (name, labels), count in samples(after).items()
        if name.startswith("agent_gateway_http_") and count != earlier.get((name, labels), 0.0)
    }
    assert routes == {
        "/decisions", "/decisions/{seq}", "/decisions/{seq}/proof", "/checkpoint/consistency", "/messages", "/users/me", "unmatched"
    }
    assert user.id not in after and "counted" not in after
    assert value(after, "agent_gateway_signals", state="pending") + value(after, "agent_gateway_signals", state="processing") + value(
        after, "agent_gateway_signals", state="done"
    ) + value(after, "agent_gateway_signals", state="failed") >= 1
    assert value(after, "agent_gateway_worker_leader") in (0.0, 1.0)
    assert ("agent_gateway_db_pool_connections_in_use", frozenset()) in samples(after)
    assert ("agent_gateway_db_pool_waiting", frozenset()) in samples(after)
    assert "agent_gateway_runs_total" in after or "# TYPE agent_gateway_runs counter" in after
    assert "agent_gateway_schedule_fire_lateness_seconds_count" in after
    assert "agent_gateway_message_write_conflicts_total" in after


async def test_decisions_are_counted_once_each_when_their_batch_commits(
    gateway: Gateway, ops: httpx.AsyncClient, agent: httpx.AsyncClient
) -> None:
    before = await scrape(ops)
    # Concurrent publishes share transactions (store.batch), counted per batch at its commit.
    answers = await asyncio.gather(*(agent.post("/decisions", json={"statement": f"d{i}"}) for i in range(24)))
    assert [answer.status_code for answer in answers] == [201] * 24
    # A refused Statement and a batch that rolls back count nothing.
    assert (await agent.post("/decisions", json={"statement": ""})).status_code == 400
    with pytest.raises(RuntimeError):
        async with gateway.store.transaction() as conn:
            await gateway.publisher._publish_many(conn, ["rolled back"])
            raise RuntimeError("roll back")
    after = await scrape(ops)
    assert value(after, "agent_gateway_decisions_total") - value(before, "agent_gateway_decisions_total") == 24


def test_no_ops_listener_no_ops_app_and_nothing_in_front_of_the_servers(settings: config.Settings) -> None:
    gateway = Gateway(dataclasses.replace(settings, ops_listen=None))
    assert gateway.ops_app is None
    assert type(gateway.public_asgi).__name__ == "FastPath" and type(gateway.agent_asgi).__name__ == "FastPath"


@pytest.mark.parametrize(
    ("environ", "listen", "log_format", "access"),
    [
        ({}, config.Address("127.0.0.1", 8702), "text", False),
        ({"AGENT_GATEWAY_OPS_LISTEN": ""}, None, "text", False),
        ({"AGENT_GATEWAY_OPS_LISTEN": "0.0.0.0:9102", "AGENT_GATEWAY_LOG_FORMAT": "json"}, config.Address("0.0.0.0", 9102), "json", True),
        ({"AGENT_GATEWAY_LOG_FORMAT": "json", "AGENT_GATEWAY_LOG_ACCESS": "false"}, config.Address("127.0.0.1", 8702), "json", False),
        ({"AGENT_GATEWAY_LOG_ACCESS": "true"}, config.Address("127.0.0.1", 8702), "text", True),
    ],
)
def test_settings(environ: dict[str, str], listen: config.Address | None, log_format: str, access: bool) -> None:
    settings = config.load(environ={"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1", **environ})
    assert (settings.ops_listen, settings.log_format, settings.access_log) == (listen, log_format, access)


@pytest.mark.parametrize(
    ("key", "raw"), [("AGENT_GATEWAY_OPS_LISTEN", "nowhere"), ("AGENT_GATEWAY_LOG_FORMAT", "xml"), ("AGENT_GATEWAY_LOG_ACCESS", "maybe")]
)
def test_bad_settings(key: str, raw: str) -> None:
    with pytest.raises(config.SettingsError, match=key):
        config.load(environ={"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1", key: raw})


@pytest.mark.parametrize(
    ("roles", "checks"),
    [({"api"}, {"database"}), ({"worker"}, {"database", "worker"}), ({"scheduler"}, {"database", "scheduler"})],
)
async def test_readiness_checks_the_loops_of_the_process_roles(
    settings: config.Settings, roles: set[str], checks: set[str]
) -> None:
    gateway = Gateway(settings, frozenset(roles))
    await gateway.start()
    try:
        assert gateway.ops_app is not None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as ops:
            response = await until_ready(ops)
            assert response.status_code == 200
            assert response.json()["checks"] == dict.fromkeys(checks, "ok")
            text = await scrape(ops)
            assert ("agent_gateway_worker_leader" in text) == ("worker" in roles)
            assert value(text, "agent_gateway_worker_leader") in (0.0, 1.0)
        if "scheduler" in roles:
            assert gateway.schedule_timer is not None
            await gateway.schedule_timer.stop()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as ops:
                response = await readyz(ops)
                assert response.status_code == 503
                assert response.json()["checks"]["scheduler"] == "the Scheduler loop is not running"
    finally:
        await gateway.stop()
