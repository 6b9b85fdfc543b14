"""Retention: pruning ended Signals and their Runs, and what the routes read afterwards (both backends)."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import clock, config
from agent_gateway.gateway import Gateway
from agent_gateway.messages import service as messages
from agent_gateway.signals import retention
from agent_gateway.store import tables
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.users import service as users
from tests import served
from tests.signals.conftest import until

pytestmark = pytest.mark.processes


@contextlib.asynccontextmanager
async def store_of(gateway: served.ServedGateway) -> AsyncIterator[Store]:
    store = Store(gateway.env["AGENT_GATEWAY_DATABASE_URL"])
    try:
        yield store
    finally:
        await store.close()

LONG_AGO = "2026-01-01T00:00:00.000Z"
DAY = timedelta(days=1)


async def _record(store: Store, state: str, emitted_at: str, run_ends: list[str | None] = ()) -> str:  # type: ignore[assignment]
    """A Signal in ``state`` with one Run per ``run_ends`` (None: still running), written directly."""
    signal_id = str(uuid.uuid4())
    async with store.transaction() as conn:
        await signal_queries.insert(conn, id=signal_id, kind="k", payload=None, emitted_at=emitted_at)
        recorded = await run_queries.record(
            conn, signal_id=signal_id, prompts=[(str(uuid.uuid4()), None, "p") for _ in run_ends]
        )
        for run, ended_at in zip(recorded, run_ends):
            await run_queries.start(conn, id=run.id, started_at=emitted_at)
            if ended_at is not None:
                await run_queries.finish(conn, id=run.id, error=None, ended_at=ended_at)
        if state != signal_queries.PENDING:
            await conn.execute(
                tables.signals.update().where(tables.signals.c.id == signal_id).values(state=state)
            )
    return signal_id


async def _counts(store: Store) -> dict[str, int]:
    async with store.read() as conn:
        return {
            table.name: (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one()
            for table in tables.metadata.sorted_tables
            if table.name != "alembic_version"
        }


async def test_prune_removes_only_signals_ended_before_the_cutoff(idle_gateway: Gateway, agent: httpx.AsyncClient) -> None:
    store = idle_gateway.store
    now = clock.now_iso()
    gone = [
        await _record(store, "done", LONG_AGO, [LONG_AGO, LONG_AGO]),
        await _record(store, "failed", LONG_AGO, [LONG_AGO]),
        await _record(store, "done", LONG_AGO),  # no Run: ended as it was taken
    ]
    kept = [
        await _record(store, "done", LONG_AGO, [LONG_AGO, now]),  # its last Run ended recently
        await _record(store, "done", now, [now]),
        await _record(store, "pending", LONG_AGO),
        await _record(store, "processing", LONG_AGO, [LONG_AGO, None]),
    ]
    async with store.transaction() as conn:
        user = await users.admit(conn)
        await messages.receive(conn, user.id, "hello")  # a pending Signal, emitted now
    pruned_run = (await agent.get("/runs", params={"signalId": gone[0]})).json()["runs"][0]["id"]
    before = await _counts(store)

    dry = await retention.prune(store, DAY, dry_run=True)
    assert (dry.signals, dry.runs, dry.dry_run) == (3, 3, True)
    assert await _counts(store) == before

    pruned = await retention.prune(store, DAY, batch=2)  # two batches and a last, empty one
    assert (pruned.signals, pruned.runs, pruned.dry_run) == (3, 3, False)
    assert pruned.before < clock.format_instant(clock.now() - DAY + timedelta(seconds=1))
    after = await _counts(store)
    assert after == {**before, "signals": before["signals"] - 3, "runs": before["runs"] - 3}

    listed = [signal["id"] for signal in (await agent.get("/signals")).json()["signals"]]
    assert set(listed) == set(kept) | {listed[0]} and len(listed) == len(kept) + 1
    for signal_id in gone:
        assert (await agent.get(f"/signals/{signal_id}")).status_code == 404
        response = await agent.get("/runs", params={"signalId": signal_id})
        assert response.status_code == 200 and response.json() == {"runs": []}
    assert (await agent.get(f"/runs/{pruned_run}")).status_code == 404
    for signal_id in kept:
        assert (await agent.get(f"/signals/{signal_id}")).status_code == 200
    assert (await retention.prune(store, DAY)).signals == 0


async def test_prune_with_no_age_takes_every_ended_signal(idle_gateway: Gateway) -> None:
    store = idle_gateway.store
    ended = await _record(store, "failed", clock.now_iso(), [clock.now_iso()])
    pending = await _record(store, "pending", LONG_AGO)
    assert (await retention.prune(store, timedelta(0))).signals == 1
    async with store.read() as conn:
        assert await signal_queries.get(conn, id=ended) is None
        assert await signal_queries.get(conn, id=pending) is not None


async def test_scheduler_role_prunes_on_its_own(settings: config.Settings) -> None:
    settings = dataclasses.replace(settings, retention_signals_max_age=timedelta(0))
    store = Store(settings.database_url)
    try:
        ended = await _record(store, "done", LONG_AGO, [LONG_AGO])
        pending = await _record(store, "pending", LONG_AGO)
    finally:
        await store.close()
    gateway = Gateway(settings, frozenset({"scheduler"}))
    await gateway.start()
    try:
        assert gateway.pruner is not None

        async def pruned() -> bool:
            async with gateway.store.read() as conn:
                return await signal_queries.get(conn, id=ended) is None

        await until(pruned)
        async with gateway.store.read() as conn:
            assert await signal_queries.get(conn, id=pending) is not None
    finally:
        await gateway.stop()


def test_other_roles_and_the_default_never_prune(settings: config.Settings) -> None:
    assert Gateway(settings).pruner is None
    aged = dataclasses.replace(settings, retention_signals_max_age=DAY)
    assert Gateway(aged, frozenset({"api", "worker"})).pruner is None
    assert Gateway(aged, frozenset({"scheduler"})).pruner is not None


@pytest.mark.parametrize(
    ("text", "age"),
    [("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("0s", timedelta(0)), ("2w", timedelta(weeks=2)), ("90m", timedelta(minutes=90))],
)
def test_ages(text: str, age: timedelta) -> None:
    assert config.parse_age(text) == age


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "1.5h", "1y", "30 d", "1d2h"])
def test_bad_ages(text: str) -> None:
    with pytest.raises(ValueError):
        config.parse_age(text)


def test_the_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    environ = {"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1"}
    assert config.load(environ=environ).retention_signals_max_age is None
    settings = config.load(environ={**environ, "AGENT_GATEWAY_RETENTION_SIGNALS_MAX_AGE": "30d"})
    assert settings.retention_signals_max_age == timedelta(days=30)
    path = tmp_path / "gateway.toml"
    path.write_text('[auth]\ntoken_ttl_ms = 1\n[retention]\nsignals_max_age = "12x"\n')
    with pytest.raises(config.SettingsError, match="retention.signals_max_age"):
        config.load(path, environ={})


@pytest.mark.e2e
async def test_prune_while_serving(served_gateway: served.ServedGateway) -> None:
    """``agent-gateway prune`` in a process of its own while ``serve`` writes the same database."""
    user = served_gateway.cli_json("users", "add")["id"]
    async with httpx.AsyncClient(base_url=served_gateway.agent_url, timeout=120) as agent:
        for n in range(3):  # the echo agent's Runs end these Signals
            assert (await agent.post("/decisions", json={"statement": f"s{n}"})).status_code == 201
        async with store_of(served_gateway) as store:
            async with store.transaction() as conn:
                for n in range(3):
                    await messages.receive(conn, user, f"hello {n}")

        async def all_ended() -> bool:
            listed = (await agent.get("/signals")).json()["signals"]
            return len(listed) == 3 and all(signal["state"] in ("done", "failed") for signal in listed)

        await until(all_ended)
        ended = [signal["id"] for signal in (await agent.get("/signals")).json()["signals"]]
        runs = {signal_id: (await agent.get("/runs", params={"signalId": signal_id})).json()["runs"] for signal_id in ended}
        assert all(runs.values())

        pruned = served_gateway.cli_json("prune", "--before", "0s")
        assert (pruned["signals"], pruned["runs"]) == (3, sum(len(r) for r in runs.values()))
        assert (await agent.get("/signals")).json() == {"signals": []}
        for signal_id in ended:
            assert (await agent.get(f"/signals/{signal_id}")).status_code == 404
            assert (await agent.get("/runs", params={"signalId": signal_id})).json() == {"runs": []}
        # Still serving, and its log is untouched: Messages and Decisions stay.
        assert len((await agent.get("/messages", params={"user": user})).json()["messages"]) >= 3
        assert len((await agent.get("/decisions")).json()["decisions"]) == 3
