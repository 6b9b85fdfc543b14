"""Deliveries from an in-process gateway to a real receiver, on both backends."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

import pytest
import sqlalchemy as sa

from agent_gateway import clock, config, ids
from agent_gateway.gateway import Gateway
from agent_gateway.scheduler import service as scheduler
from agent_gateway.store import tables, vacuum
from agent_gateway.store.queries import webhooks as deliveries
from agent_gateway.users import service as users
from agent_gateway.webhooks import outbox
from tests.webhooks.conftest import endpoint, with_endpoints
from tests.webhooks.receiver import Receiver


async def admit(gateway: Gateway) -> str:
    async with gateway.store.transaction() as conn:
        return (await users.admit(conn)).id


async def stored(gateway: Gateway, state: str | None = None) -> list[deliveries.Delivery]:
    async with gateway.store.read() as conn:
        return await deliveries.newest(conn, limit=1000, state=state)


async def until(check, timeout: float = 240):  # type: ignore[no-untyped-def]
    """Poll an async ``check`` until it returns something true (a ceiling, not an expectation)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await check()
        if found or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.05)


async def test_every_event_arrives_signed_with_its_record(hooked: Gateway, receiver: Receiver) -> None:
    user_id = await admit(hooked)
    inbound = await hooked.messages.receive(user_id, "hello")
    outbound = await hooked.messages.send(user_id, "hi there")
    decision = await hooked.publisher.publish("we ship on Friday")
    async with hooked.store.transaction() as conn:
        # A moment ahead: an instant that is already past when the put reads the clock is refused.
        soon = clock.format_instant(clock.now() + datetime.timedelta(milliseconds=500))
        await scheduler.put_body(conn, "soon", {"spec": {"kind": "once", "at": soon}, "data": {"n": 1}})
    # The Message's Run fails (no agent program), and so does its Signal; so does the fire's
    # Signal (no Handler), which has no Run: seven events.
    got = await asyncio.to_thread(receiver.wait_for, 7)
    assert all(r.verified for r in receiver.received)
    by_type: dict[str, list] = {}
    for r in got:
        by_type.setdefault(r.payload["type"], []).append(r.payload)
    assert sorted(by_type) == sorted(config.WEBHOOK_EVENTS)
    [message] = by_type["message.inbound"]
    assert message == {"type": "message.inbound", "timestamp": inbound.created_at, "data": inbound.to_json()}
    assert by_type["message.outbound"][0]["data"] == outbound.to_json()
    assert by_type["decision.published"][0] == {
        "type": "decision.published", "timestamp": decision.created_at, "data": decision.to_json()
    }
    [fired] = by_type["schedule.fired"]
    assert fired["data"]["kind"] == scheduler.FIRED_KIND and fired["data"]["payload"]["scheduleName"] == "soon"
    [run] = by_type["run.ended"]
    assert run["data"]["state"] == "failed" and run["data"]["signalId"] == by_type["signal.failed"][0]["data"]["id"]
    assert run["timestamp"] == run["data"]["endedAt"]
    assert {payload["data"]["kind"] for payload in by_type["signal.failed"]} == {"message.received", scheduler.FIRED_KIND}
    assert all(payload["data"]["state"] == "failed" for payload in by_type["signal.failed"])
    # The ids are the deliveries', each sent once here.
    assert len({r.id for r in got}) == 7
    delivered = await until(lambda: _all_delivered(hooked, 7))
    assert sorted(d.id for d in delivered) == sorted(r.id for r in got)


async def _all_delivered(gateway: Gateway, count: int) -> list[deliveries.Delivery]:
    """The delivered deliveries once there are ``count`` (a receiver's 2xx precedes the record of it)."""
    delivered = await stored(gateway, "delivered")
    return delivered if len(delivered) >= count else []


async def test_a_failing_receiver_gets_the_same_delivery_once_it_answers(hooked: Gateway, receiver: Receiver) -> None:
    receiver.fail_first = 3
    decision = await hooked.publisher.publish("retry me")
    [accepted] = await asyncio.to_thread(receiver.wait_for, 1)
    attempts = receiver.received
    assert [r.status for r in attempts] == [500, 500, 500, 204]
    assert {r.id for r in attempts} == {accepted.id}
    assert {r.body for r in attempts} == {accepted.body}  # the same bytes, each attempt signed anew
    assert accepted.payload["data"] == decision.to_json()
    [delivery] = await until(lambda: stored(hooked, "delivered"))
    assert (delivery.id, delivery.attempts, delivery.last_error) == (accepted.id, 4, None)


async def test_a_decision_delivery_holds_its_number_and_sends_the_decision(hooked: Gateway, receiver: Receiver) -> None:
    receiver.fail_first = 1
    decisions = [await hooked.publisher.publish(text) for text in ("first", "ünïcode \u2028 \"quoted\"")]
    async with hooked.store.read() as conn:
        rows = (await conn.execute(sa.select(tables.webhook_deliveries.c.body, tables.webhook_deliveries.c.decision_seq))).all()
    assert sorted(rows) == [(None, decisions[0].seq), (None, decisions[1].seq)]  # no copy of the Decision
    got = await asyncio.to_thread(receiver.wait_for, 2)
    for decision in decisions:
        [accepted] = [r for r in got if r.payload["data"]["seq"] == decision.seq]
        # The bytes the event-time copy would have been, on the failed attempt and the accepted one.
        expected = outbox.body("decision.published", decision.created_at, decision.to_json()).encode()
        assert {r.body for r in receiver.received if r.id == accepted.id} == {expected}
    assert [r.status for r in receiver.received].count(500) == 1


async def test_a_delivery_whose_decision_is_missing_fails_saying_so(hooked: Gateway, receiver: Receiver) -> None:
    """Cannot happen (a Decision is never removed); if it did, the attempt fails instead of sending."""
    async with hooked.store.transaction() as conn:
        now = clock.now_iso()
        row = (ids.new(), receiver.url, "decision.published", None, 999, now, now, now)
        await deliveries.insert(conn, [row], channel=outbox.CHANNEL)
    [failed] = await until(lambda: stored(hooked, "failed"))
    assert failed.last_error == "Decision 999 is not in the log"
    assert receiver.received == []


async def test_retries_end_dead(settings: config.Settings, receiver: Receiver) -> None:
    receiver.fail_first = 1_000_000
    hooked = dataclasses.replace(with_endpoints(settings, endpoint(receiver, ("decision.published",))), webhook_retry_for=datetime.timedelta(seconds=2))
    gateway = Gateway(hooked)
    await gateway.start()
    try:
        await gateway.publisher.publish("nobody listens")
        [dead] = await until(lambda: stored(gateway, "dead"))
        assert dead.last_error == "HTTP 500" and dead.attempts >= 2
        assert {r.id for r in receiver.received} == {dead.id}
    finally:
        await gateway.stop()


async def test_a_rolled_back_publish_sends_nothing(hooked: Gateway, receiver: Receiver) -> None:
    from agent_gateway.decisions import service as decisions

    with pytest.raises(RuntimeError):
        async with hooked.store.transaction() as conn:
            await decisions.publish(conn, hooked.identity, "never committed")
            assert len(await _rows(conn)) == 1  # written, in this transaction
            raise RuntimeError("roll back")
    committed = await hooked.publisher.publish("committed")
    [got] = await asyncio.to_thread(receiver.wait_for, 1)
    assert got.payload["data"] == committed.to_json()
    assert [d.event for d in await stored(hooked)] == ["decision.published"]


async def test_a_rolled_back_message_sends_nothing(hooked: Gateway, receiver: Receiver) -> None:
    """A Message's deliveries are written by the transaction's last statement on PostgreSQL
    (engine.carry): one that rolls back before it writes none."""
    from agent_gateway.messages import service as messages

    user_id = await admit(hooked)
    with pytest.raises(RuntimeError):
        async with hooked.store.transaction() as conn:
            await messages.receive(conn, user_id, "never committed")
            raise RuntimeError("roll back")
    async with hooked.store.transaction() as conn:  # one that commits, carrying the same kind of rows
        committed = await messages.receive(conn, user_id, "committed")
    got = await asyncio.to_thread(receiver.wait_for, 3)  # message.inbound, then its Run's and Signal's failures
    assert [r.payload["data"] for r in got if r.payload["type"] == "message.inbound"] == [committed.to_json()]
    assert "never committed" not in str([r.payload for r in receiver.received])
    assert all(d.created_at >= committed.created_at for d in await stored(hooked))


async def _rows(conn):  # type: ignore[no-untyped-def]
    import sqlalchemy as sa

    from agent_gateway.store.tables import webhook_deliveries

    return (await conn.execute(sa.select(webhook_deliveries.c.id))).all()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_the_deliverer_vacuums_the_outbox_every_so_many_claims(
    hooked: Gateway, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vacuum, "EVERY", 2)  # store/vacuum.py: the claims' dead index entries go

    async def vacuums() -> int:
        async with hooked.store.read() as conn:
            return (await conn.exec_driver_sql(
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'webhook_deliveries'"
            )).scalar()

    assert await vacuums() == 0
    for text in ("one", "two"):
        await hooked.publisher.publish(text)
    await asyncio.to_thread(receiver.wait_for, 2)
    assert await until(vacuums) >= 1
