"""The queue and the one-way states, at the store and service level, on both backends."""

from __future__ import annotations

import uuid

from agent_gateway import clock
from agent_gateway.signals import service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries

from tests.signals.conftest import GatewayFactory, Recording, emit, finished, runs_of, signal_of


async def test_emit_wakes_subscribers_only_after_commit(store: Store) -> None:
    subscription = store.subscribe(service.CHANNEL)
    async with store.transaction() as conn:
        await service.emit(conn, "k", {})
        assert not await subscription.wait(0.01)
    assert await subscription.wait(5)

    try:
        async with store.transaction() as conn:
            await service.emit(conn, "k", {})
            raise LookupError()
    except LookupError:
        pass
    assert not await subscription.wait(0.01)
    store.unsubscribe(service.CHANNEL, subscription)


async def test_the_oldest_pending_signal_is_claimed_first_ties_by_emission(store: Store) -> None:
    frozen = clock.FrozenClock("2026-01-01T00:00:05Z")
    with clock.use(frozen):
        later = await emit(store, "k", 1)
        frozen.set("2026-01-01T00:00:01Z")
        tie_first = await emit(store, "k", 2)
        tie_second = await emit(store, "k", 3)
    claimed = []
    while True:
        async with store.transaction() as conn:
            signal = await signal_queries.claim_oldest(conn)
        if signal is None:
            break
        assert signal.state == "processing"
        claimed.append(signal.id)
    assert claimed == [tie_first, tie_second, later]


async def test_states_are_one_way(store: Store) -> None:
    signal_id = await emit(store, "k", None)
    run_id = str(uuid.uuid4())
    async with store.transaction() as conn:
        # Not yet processing: it cannot end.
        assert not await signal_queries.finish(conn, id=signal_id, error=None)
        assert (await signal_queries.claim_oldest(conn)).id == signal_id  # type: ignore[union-attr]
        await run_queries.record(conn, signal_id=signal_id, prompts=[(run_id, "s", "p")])
        assert not await run_queries.finish(conn, id=run_id, error=None, ended_at="x")  # pending cannot end
        assert await run_queries.start(conn, id=run_id, started_at="2026-01-01T00:00:00.000Z")
        assert not await run_queries.start(conn, id=run_id, started_at="2026-01-01T00:00:01.000Z")
        assert await run_queries.finish(conn, id=run_id, error="why", ended_at="2026-01-01T00:00:02.000Z")
        assert not await run_queries.finish(conn, id=run_id, error=None, ended_at="2026-01-01T00:00:03.000Z")
        assert await signal_queries.finish(conn, id=signal_id, error="why")
        assert not await signal_queries.finish(conn, id=signal_id, error=None)
        assert await signal_queries.claim_oldest(conn) is None
        assert await service.recover(conn) == []
    async with store.read() as conn:
        signal = await service.get_signal(conn, signal_id)
        run = await service.get_run(conn, run_id)
    assert (signal.state, signal.error) == ("failed", "why")
    assert (run.state, run.error, run.started_at, run.ended_at) == (
        "failed", "why", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:02.000Z",
    )


async def test_a_run_recorded_started_is_running_and_its_later_runs_pending(store: Store) -> None:
    signal_id = await emit(store, "k", None)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    async with store.transaction() as conn:
        await signal_queries.claim_oldest(conn)
        recorded = await run_queries.record(
            conn, signal_id=signal_id, prompts=[(first, "a", "1"), (second, "b", "2")],
            first_started_at="2026-01-01T00:00:00.000Z",
        )
        assert not await run_queries.start(conn, id=first, started_at="2026-01-01T00:00:01.000Z")  # already running
    async with store.read() as conn:
        stored = [await service.get_run(conn, run_id) for run_id in (first, second)]
    assert [(run.state, run.started_at) for run in recorded] == [
        ("running", "2026-01-01T00:00:00.000Z"), ("pending", None),
    ]
    assert stored == recorded


async def test_ending_a_run_and_its_signal_claims_the_next_and_stays_one_way(store: Store) -> None:
    """``end_and_claim`` (one statement on PostgreSQL) does what its three parts do, in order."""
    first = await emit(store, "k", {"n": 1})
    second = await emit(store, "k", {"n": 2})
    run_id = str(uuid.uuid4())
    async with store.transaction() as conn:
        assert (await signal_queries.claim_oldest(conn)).id == first  # type: ignore[union-attr]
        await run_queries.record(conn, signal_id=first, prompts=[(run_id, "s", "p")], first_started_at="2026-01-01T00:00:00.000Z")
        claimed = await signal_queries.end_and_claim(
            conn, run_id=run_id, run_error="why", ended_at="2026-01-01T00:00:01.000Z", signal_id=first,
            signal_error="because", signal_error_if_cancelled="cancelled",
        )
    assert claimed is not None and (claimed.id, claimed.payload, claimed.state) == (second, {"n": 2}, "processing")
    # Again, from the states it left: nothing changes, and nothing is pending to claim.
    async with store.transaction() as conn:
        assert await signal_queries.end_and_claim(
            conn, run_id=run_id, run_error=None, ended_at="2026-01-01T00:00:02.000Z", signal_id=first,
            signal_error=None, signal_error_if_cancelled="cancelled",
        ) is None
    async with store.read() as conn:
        signals = [await service.get_signal(conn, id) for id in (first, second)]
        run = await service.get_run(conn, run_id)
    assert [(s.state, s.error) for s in signals] == [("failed", "because"), ("processing", None)]  # type: ignore[union-attr]
    assert (run.state, run.error, run.ended_at) == ("failed", "why", "2026-01-01T00:00:01.000Z")  # type: ignore[union-attr]


async def test_recovery_fails_what_a_stopped_process_left_and_runs_what_is_pending(
    store: Store, make_gateway: GatewayFactory
) -> None:
    """As at start after a crash: never re-run a processing Signal; run the pending ones."""
    left, done_run, running_run, pending_run = (str(uuid.uuid4()) for _ in range(4))
    async with store.transaction() as conn:
        await signal_queries.insert(conn, id=left, kind="k", payload={}, emitted_at=clock.now_iso())
        await signal_queries.claim_oldest(conn)
        await run_queries.record(
            conn, signal_id=left, prompts=[(done_run, "a", "1"), (running_run, "b", "2"), (pending_run, "c", "3")]
        )
        for run_id in (done_run, running_run):
            await run_queries.start(conn, id=run_id, started_at=clock.now_iso())
        await run_queries.finish(conn, id=done_run, error=None, ended_at=clock.now_iso())
    waiting = await emit(store, "k", {})

    runtime = Recording()
    from agent_gateway.signals.handlers import TemplateHandler

    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "again")})
    assert (await finished(gateway.store, waiting)).state == "done"

    signal = await signal_of(gateway.store, left)
    assert (signal.state, signal.error) == ("failed", service.STOPPED_SIGNAL_ERROR)
    runs = {run.id: run for run in await runs_of(gateway.store, left)}
    assert (runs[done_run].state, runs[done_run].error) == ("done", None)
    assert (runs[running_run].state, runs[running_run].error) == ("failed", service.STOPPED_RUN_ERROR)
    assert runs[running_run].ended_at is not None
    assert (runs[pending_run].state, runs[pending_run].error) == ("failed", service.NOT_STARTED_RUN_ERROR)
    assert runs[pending_run].started_at is None
    # Only the pending Signal's Run was handed to the runtime.
    assert [run.signal_id for run in runtime.runs] == [waiting]
