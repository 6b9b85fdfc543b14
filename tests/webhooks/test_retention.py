"""Retention of webhook deliveries: delivered and dead rows older than the cutoff go, in batches;
pending and retrying ones never do (both backends)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signals import retention
from agent_gateway.store import tables
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import webhooks as queries
from tests import served
from tests.signals.conftest import until
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_served import hooked_env, publish

LONG_AGO = "2026-01-01T00:00:00.000Z"
FAR_AHEAD = "2999-01-01T00:00:00.000Z"
DAY = timedelta(days=1)


async def _delivery(store: Store, state: str, next_attempt_at: str) -> str:
    """A delivery in ``state`` closed (or next due) at ``next_attempt_at``, written directly."""
    delivery_id = str(uuid.uuid4())
    async with store.transaction() as conn:
        await conn.execute(
            tables.webhook_deliveries.insert().values(
                id=delivery_id, url="http://127.0.0.1:9/hook", event="run.ended", body="{}", decision_seq=None,
                created_at=LONG_AGO, state=state, attempts=0 if state == queries.PENDING else 1,
                next_attempt_at=next_attempt_at, retry_from=LONG_AGO,
                delivered_at=next_attempt_at if state == queries.DELIVERED else None,
            )
        )
    return delivery_id


async def _states(store: Store) -> dict[str, str]:
    async with store.read() as conn:
        rows = await conn.execute(sa.select(tables.webhook_deliveries.c.id, tables.webhook_deliveries.c.state))
        return {str(row.id): row.state for row in rows}


async def _every_kind(store: Store) -> dict[str, str]:
    """One delivery of each state long ago and one recent; by id, what it is."""
    made = {}
    for state in queries.STATES:
        made[await _delivery(store, state, LONG_AGO)] = f"{state} long ago"
        made[await _delivery(store, state, FAR_AHEAD)] = f"{state} recent"
    return made


async def test_prune_takes_only_closed_deliveries_older_than_the_cutoff(store: Store) -> None:
    made = await _every_kind(store)
    dry = await retention.prune(store, DAY, dry_run=True)
    assert dry.outboxes == {"deliveries": 2, "channelDeliveries": 0} and dry.to_json()["deliveries"] == 2
    assert len(await _states(store)) == 8  # a dry run removes nothing

    pruned = await retention.prune(store, DAY)
    assert pruned.to_json() == {
        "before": pruned.before, "signals": 0, "runs": 0, "deliveries": 2, "channelDeliveries": 0, "dryRun": False
    }
    left = sorted(made[delivery_id] for delivery_id in await _states(store))
    assert left == sorted(
        ["pending long ago", "failed long ago", "pending recent", "failed recent", "delivered recent", "dead recent"]
    )
    assert (await retention.prune(store, DAY)).outboxes == {"deliveries": 0, "channelDeliveries": 0}


async def test_pending_and_retrying_deliveries_are_never_pruned_whatever_the_age(store: Store) -> None:
    for state in (queries.PENDING, queries.FAILED):
        await _delivery(store, state, LONG_AGO)
    assert (await retention.prune(store, timedelta(0))).outboxes == {"deliveries": 0, "channelDeliveries": 0}
    assert sorted((await _states(store)).values()) == ["failed", "pending"]


async def test_prune_goes_in_batches(store: Store) -> None:
    for n in range(5):
        await _delivery(store, queries.DELIVERED if n % 2 else queries.DEAD, LONG_AGO)
    await _delivery(store, queries.PENDING, LONG_AGO)
    # Batches of two: two full ones and a short one.
    assert await retention.prune_outbox(store, "deliveries", DAY, batch=2) == 5
    assert list((await _states(store)).values()) == ["pending"]


async def test_an_operators_retry_between_select_and_delete_keeps_the_row(store: Store) -> None:
    """The delete re-checks the state: a dead delivery the operator retried meanwhile stays."""
    from agent_gateway.store.queries import retention as retention_queries

    dead = await _delivery(store, queries.DEAD, LONG_AGO)
    async with store.transaction() as conn:
        assert await queries.retry(conn, id=dead, now=LONG_AGO) is not None
        assert await retention_queries.delete_closed(conn, queries.OUTBOX, cutoff=FAR_AHEAD, limit=10) == 0
    assert await _states(store) == {dead: "pending"}


async def test_the_scheduler_role_prunes_deliveries_on_its_own(settings: config.Settings) -> None:
    store = Store(settings.database_url)
    try:
        old = await _delivery(store, queries.DELIVERED, LONG_AGO)
        pending = await _delivery(store, queries.PENDING, LONG_AGO)
    finally:
        await store.close()
    gateway = Gateway(dataclasses.replace(settings, retention_deliveries_max_age=DAY), frozenset({"scheduler"}))
    await gateway.start()
    try:
        assert gateway.pruner is not None

        async def pruned() -> bool:
            return old not in await _states(gateway.store)

        await until(pruned)
        assert pending in await _states(gateway.store)
    finally:
        await gateway.stop()


def test_other_roles_and_the_default_never_prune_deliveries(settings: config.Settings) -> None:
    aged = dataclasses.replace(settings, retention_deliveries_max_age=DAY)
    assert Gateway(settings, frozenset({"scheduler"})).pruner is None
    assert Gateway(aged, frozenset({"api", "worker"})).pruner is None
    pruner = Gateway(aged, frozenset({"scheduler"})).pruner
    assert pruner is not None and pruner.outbox_ages == {"deliveries": DAY, "channelDeliveries": DAY} and pruner.max_age is None


def test_the_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    environ = {"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1"}
    assert config.load(environ=environ).retention_deliveries_max_age is None
    settings = config.load(environ={**environ, "AGENT_GATEWAY_RETENTION_DELIVERIES_MAX_AGE": "7d"})
    assert settings.retention_deliveries_max_age == timedelta(days=7)
    path = tmp_path / "gateway.toml"
    path.write_text('[auth]\ntoken_ttl_ms = 1\n[retention]\ndeliveries_max_age = "12h"\n')
    assert config.load(path, environ={}).retention_deliveries_max_age == timedelta(hours=12)
    path.write_text('[auth]\ntoken_ttl_ms = 1\n[retention]\ndeliveries_max_age = "7 days"\n')
    with pytest.raises(config.SettingsError, match="retention.deliveries_max_age"):
        config.load(path, environ={})


@pytest.mark.e2e
def test_prune_while_serving_takes_the_delivered_and_the_deliverer_goes_on(
    tmp_path: Path, database_url: str, receiver: Receiver
) -> None:
    """``agent-gateway prune`` in a process of its own while ``serve`` delivers to the same database."""
    with served.ServedGateway.start(tmp_path / "deployment", database_url, hooked_env(receiver)) as gateway:
        for n in range(3):
            publish(gateway, f"s{n}")
        receiver.wait_for(3)

        def states() -> list[str]:
            return [delivery["state"] for delivery in gateway.cli_json("webhooks", "deliveries")]

        deadline = time.monotonic() + served.START_TIMEOUT_S
        while states() != ["delivered"] * 3:  # the outcome is recorded just after the receiver's answer
            assert time.monotonic() < deadline, states()
            time.sleep(0.05)
        assert gateway.cli_json("prune", "--before", "0s", "--dry-run")["deliveries"] == 3
        assert gateway.cli_json("prune", "--before", "0s")["deliveries"] == 3
        assert states() == []
        # Still serving and delivering.
        publish(gateway, "after the prune")
        assert receiver.wait_for(4)[-1].payload["data"]["statement"] == "after the prune"
