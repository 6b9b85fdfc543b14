"""A claim's lease covers each attempt of its batch: a delivery whose lease ran out before its turn,
and that another deliverer took meanwhile, is not sent again. On both backends."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import REGISTRY

from agent_gateway import clock, config, ids
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import webhooks as queries
from agent_gateway.webhooks import deliverer, outbox
from agent_gateway.webhooks.deliverer import Deliverer, Policy
from tests.webhooks.receiver import WAIT_S, Receiver

# An attempt that ends at all ends within this; the tests never wait for it to run out.
TIMEOUT_S = 30.0


async def write_pending(store: Store, url: str, count: int) -> list[str]:
    """``count`` pending deliveries to ``url``, in this order; their ids."""
    now = clock.now_iso()
    rows = [
        (ids.new(), url, outbox.RUN_ENDED, outbox.body(outbox.RUN_ENDED, now, {"n": n}), None, now, now, now)
        for n in range(count)
    ]
    async with store.transaction() as conn:
        await queries.insert(conn, rows, channel=outbox.CHANNEL)
    return [row[0] for row in rows]


def policy(timeout_s: float = TIMEOUT_S, retry_for: datetime.timedelta = datetime.timedelta(days=1)) -> Policy:
    return Policy(retry_for=retry_for, first_retry_s=3600.0, timeout_s=timeout_s)


def to(receiver: Receiver) -> config.WebhookEndpoint:
    return config.WebhookEndpoint(receiver.url, frozenset({outbox.RUN_ENDED}), receiver.secret, allow_private=True)


def superseded() -> float:
    return REGISTRY.get_sample_value("agent_gateway_webhook_deliveries_total", {"outcome": "superseded"}) or 0.0


class Ahead:
    """The system's clock, moved ahead at will: the time a slow batch takes, without waiting for it."""

    def __init__(self) -> None:
        self.by = datetime.timedelta(0)

    def __call__(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + self.by


@pytest.fixture
def ahead() -> Iterator[Ahead]:
    with clock.use(Ahead()) as source:
        yield source  # type: ignore[misc]


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database: two processes' deliverers."""
    first, second = Store(database_url), Store(database_url)
    yield first, second
    await first.close()
    await second.close()


def pause_after_recording(
    monkeypatch: pytest.MonkeyPatch, first_id: str, leases: dict[str, str]
) -> tuple[asyncio.Event, asyncio.Event]:
    """Deliverers record each attempt's lease in ``leases`` and stop right after recording
    ``first_id``'s until the second event is set: (set once stopped, resumes)."""
    paused, resume = asyncio.Event(), asyncio.Event()
    record = queries.record

    async def record_then_pause(store, claimed, error, backoff):  # type: ignore[no-untyped-def]
        leases[claimed.id] = claimed.lease
        recorded = await record(store, claimed, error, backoff)
        if claimed.id == first_id and not paused.is_set():
            paused.set()
            await resume.wait()
        return recorded

    monkeypatch.setattr(queries, "record", record_then_pause)
    return paused, resume


async def test_a_delivery_whose_lease_ran_out_before_its_turn_is_not_sent_again(
    stores: tuple[Store, Store], receiver: Receiver, ahead: Ahead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One deliverer claims two deliveries in one batch and sends the first; by the time the second's
    turn comes its lease has run out (an attempt's timeout and the margin later) and a second
    deliverer has claimed and sent it: the first must not send it as well."""
    first_store, second_store = stores
    first_id, second_id = await write_pending(first_store, receiver.url, 2)
    # The first deliverer stops between its two attempts, right after recording the first.
    paused, resume = pause_after_recording(monkeypatch, first_id, {})
    first = Deliverer(first_store, [to(receiver)], policy())
    second = Deliverer(second_store, [to(receiver)], policy())
    first.start()
    try:
        async with asyncio.timeout(WAIT_S):
            await paused.wait()
        before = superseded()
        # Its batch's lease has run out: for the second deliverer, the second delivery is due.
        ahead.by = datetime.timedelta(seconds=TIMEOUT_S + deliverer.LEASE_MARGIN_S + 1)
        second.start()
        got = await asyncio.to_thread(receiver.wait_for, 2)
        assert [r.id for r in got] == [first_id, second_id]
        resume.set()
        # The first deliverer comes to the second delivery, and finds it taken.
        async with asyncio.timeout(WAIT_S):
            while superseded() == before:
                await asyncio.sleep(0.05)
    finally:
        resume.set()
        await first.stop()
        await second.stop()
    assert [r.id for r in receiver.received] == [first_id, second_id]  # each sent once
    assert receiver.overlapped == []
    async with first_store.read() as conn:
        assert {d.id: d.state for d in await queries.newest(conn, limit=10)} == {
            first_id: "delivered", second_id: "delivered"
        }


async def test_an_attempt_late_in_its_batch_renews_its_lease_first(
    store: Store, receiver: Receiver, ahead: Ahead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same late turn with no other deliverer about: the lease is renewed before the attempt,
    so that no deliverer can take the delivery while it is being sent, and the attempt is made."""
    first_id, second_id = await write_pending(store, receiver.url, 2)
    leases: dict[str, str] = {}
    paused, resume = pause_after_recording(monkeypatch, first_id, leases)
    sender = Deliverer(store, [to(receiver)], policy())
    sender.start()
    try:
        async with asyncio.timeout(WAIT_S):
            await paused.wait()
        ahead.by = datetime.timedelta(seconds=TIMEOUT_S + deliverer.LEASE_MARGIN_S + 1)
        resume.set()
        got = await asyncio.to_thread(receiver.wait_for, 2)
        assert [r.id for r in got] == [first_id, second_id]
        async with asyncio.timeout(WAIT_S):
            while second_id not in leases:
                await asyncio.sleep(0.05)
    finally:
        resume.set()
        await sender.stop()
    # Held, when sent, past the end of an attempt begun at its (late) turn.
    assert clock.parse_instant(leases[second_id]) > clock.parse_instant(leases[first_id]) + ahead.by
    async with store.read() as conn:
        assert {d.id: (d.state, d.attempts) for d in await queries.newest(conn, limit=10)} == {
            first_id: ("delivered", 1), second_id: ("delivered", 1)
        }
