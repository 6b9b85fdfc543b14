"""Group commit (store.batch): many items to a transaction, each caller its own outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.decisions import service
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.batch import Batcher, Lookups
from agent_gateway.store.engine import Store
from agent_gateway.store.window import Window

identity = SigningIdentity(keys.generate_pem("ed25519"))
# A ceiling for what the tests wait for, never a duration.
WAIT_CEILING_S = 120.0


class Refused(Exception):
    pass


class Recording:
    """A write that publishes each item as a Decision, refusing "refused" and breaking on "boom"."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def __call__(self, conn: AsyncConnection, items: Sequence[str]) -> list[service.Decision | Exception]:
        self.batches.append(list(items))
        kept = [item for item in items if item != "refused"]
        published = iter(await service.publish_many(conn, identity, kept) if kept else [])
        if "boom" in items:  # after writing: the transaction must take all of it back
            raise RuntimeError("boom")
        return [Refused() if item == "refused" else next(published) for item in items]


async def statements(store: Store) -> list[str]:
    return [decision.statement for decision in await service.read(store, Window(after=0))]


async def test_concurrent_items_share_transactions_in_the_order_they_came(store: Store) -> None:
    write = Recording()
    batcher: Batcher[str, service.Decision] = Batcher(store, write)
    items = [f"d{index}" for index in range(40)]
    published = await asyncio.gather(*(batcher.submit(item) for item in items))
    assert [decision.statement for decision in published] == items
    assert [decision.seq for decision in published] == list(range(1, 41))
    assert await statements(store) == items
    assert len(write.batches) < len(items)
    assert [item for batch in write.batches for item in batch] == items


async def test_a_lone_item_is_written_at_once_in_a_batch_of_its_own(store: Store) -> None:
    write = Recording()
    batcher: Batcher[str, service.Decision] = Batcher(store, write)
    for item in ("a", "b"):
        assert (await batcher.submit(item)).statement == item
    assert write.batches == [["a"], ["b"]]


async def test_batches_are_capped(store: Store) -> None:
    write = Recording()
    batcher: Batcher[str, service.Decision] = Batcher(store, write, limit=3)
    await asyncio.gather(*(batcher.submit(f"d{index}") for index in range(10)))
    assert max(len(batch) for batch in write.batches) == 3
    assert len(await statements(store)) == 10


async def test_a_writer_idle_for_its_linger_runs_its_idle_step_once_and_items_after_it_are_written(store: Store) -> None:
    """``idle`` runs on the writer's connection once nothing came for ``linger`` after a batch;
    an item that comes within the linger is written with no idle step before it."""
    write = Recording()
    idled: list[list[str]] = []
    arrived_meanwhile: list[asyncio.Task[service.Decision]] = []

    async def idle(conn: AsyncConnection) -> None:
        idled.append([item for batch in write.batches for item in batch])
        if len(idled) == 1:  # an item that comes while the idle step runs is written after it
            arrived_meanwhile.append(asyncio.create_task(batcher.submit("during")))
            await asyncio.sleep(0)

    batcher: Batcher[str, service.Decision] = Batcher(store, write, idle=idle, linger=WAIT_CEILING_S)
    assert (await batcher.submit("a")).statement == "a"
    assert (await batcher.submit("b")).statement == "b"  # within the linger: no idle step yet
    assert idled == []
    batcher._linger = 0.0  # from now on the writer stops lingering at once
    assert (await batcher.submit("c")).statement == "c"
    async with asyncio.timeout(WAIT_CEILING_S):
        while len(idled) < 2:
            await asyncio.sleep(0.01)
    assert (await arrived_meanwhile[0]).statement == "during"
    assert idled == [["a", "b", "c"], ["a", "b", "c", "during"]]
    assert await statements(store) == ["a", "b", "c", "during"]


async def test_an_item_refused_without_harm_fails_alone(store: Store) -> None:
    batcher: Batcher[str, service.Decision] = Batcher(store, Recording())
    outcomes = await asyncio.gather(*(batcher.submit(item) for item in ("a", "b", "refused", "c")), return_exceptions=True)
    assert isinstance(outcomes[2], Refused)
    assert await statements(store) == ["a", "b", "c"]


async def test_a_failed_transaction_is_retried_item_by_item(store: Store) -> None:
    write = Recording()
    batcher: Batcher[str, service.Decision] = Batcher(store, write)
    outcomes = await asyncio.gather(
        *(batcher.submit(item) for item in ("first", "a", "boom", "b")), return_exceptions=True
    )
    assert isinstance(outcomes[2], RuntimeError)
    assert [outcome.statement for outcome in outcomes if not isinstance(outcome, Exception)] == ["first", "a", "b"]
    # They failed together, then went one by one: the error is the one item's.
    assert write.batches == [["first", "a", "boom", "b"], ["first"], ["a"], ["boom"], ["b"]]
    assert await statements(store) == ["first", "a", "b"]


async def test_a_caller_cancelled_before_its_batch_withdraws_its_item(store: Store) -> None:
    write = Recording()
    batcher: Batcher[str, service.Decision] = Batcher(store, write)
    running = asyncio.ensure_future(batcher.submit("running"))
    await asyncio.sleep(0)  # its transaction has begun; the next two wait for it
    withdrawn = asyncio.ensure_future(batcher.submit("withdrawn"))
    kept = asyncio.ensure_future(batcher.submit("kept"))
    await asyncio.sleep(0)
    withdrawn.cancel()
    assert (await running).statement == "running"
    assert (await kept).statement == "kept"
    with pytest.raises(asyncio.CancelledError):
        await withdrawn
    assert await statements(store) == ["running", "kept"]
    assert write.batches == [["running"], ["kept"]]


async def test_a_batch_the_database_refuses_fails_every_item_at_once(store: Store) -> None:
    write = Recording()

    async def unreachable(conn: AsyncConnection, items: Sequence[str]) -> list[service.Decision | Exception]:
        write.batches.append(list(items))
        raise ConnectionResetError("the server went away")

    batcher: Batcher[str, service.Decision] = Batcher(store, unreachable)
    outcomes = await asyncio.gather(*(batcher.submit(item) for item in ("a", "b", "c")), return_exceptions=True)
    assert all(isinstance(outcome, ConnectionResetError) for outcome in outcomes)
    # Not tried again item by item: each would only wait for the database again.
    assert write.batches == [["a", "b", "c"]]


# --- Lookups: reads, many to a statement ----------------------------------------------


class Reading:
    """A read that answers each item doubled, holding each batch until ``release`` (if given) is
    set; it records each batch and the task it ran in. "boom" breaks the batch it is in."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.batches: list[list[str]] = []
        self.tasks: list[asyncio.Task[object] | None] = []
        self.release = release

    async def __call__(self, items: Sequence[str]) -> list[str]:
        self.batches.append(list(items))
        self.tasks.append(asyncio.current_task())
        if self.release is not None:
            await self.release.wait()
        if "boom" in items:
            raise RuntimeError("boom")
        return [item * 2 for item in items]


async def test_a_lone_read_runs_at_once_in_its_callers_task() -> None:
    read = Reading()
    lookups: Lookups[str, str] = Lookups(read)
    assert await lookups("a") == "aa"
    assert await lookups("b") == "bb"
    assert read.batches == [["a"], ["b"]]
    assert read.tasks == [asyncio.current_task()] * 2


async def test_reads_asked_while_one_runs_go_together_after_it_each_answered_in_its_place() -> None:
    release = asyncio.Event()
    read = Reading(release)
    lookups: Lookups[str, str] = Lookups(read)
    first = asyncio.ensure_future(lookups("first"))
    await asyncio.sleep(0)  # its read has begun: the next ones wait for it
    waiting = [asyncio.ensure_future(lookups(f"r{index}")) for index in range(5)]
    await asyncio.sleep(0)
    assert read.batches == [["first"]]  # not one of them was read before the first ended
    release.set()
    assert await first == "firstfirst"
    assert await asyncio.gather(*waiting) == [f"r{index}" * 2 for index in range(5)]
    assert read.batches == [["first"], [f"r{index}" for index in range(5)]]
    assert await lookups("after") == "afterafter"  # idle again: at once, alone
    assert read.batches[-1] == ["after"]


async def test_read_batches_are_capped() -> None:
    release = asyncio.Event()
    read = Reading(release)
    lookups: Lookups[str, str] = Lookups(read, limit=3)
    asked = [asyncio.ensure_future(lookups(f"r{index}")) for index in range(8)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*asked) == [f"r{index}" * 2 for index in range(8)]
    assert read.batches == [["r0"], ["r1", "r2", "r3"], ["r4", "r5", "r6"], ["r7"]]


async def test_a_failed_read_is_the_answer_of_its_batch_alone() -> None:
    release = asyncio.Event()
    read = Reading(release)
    lookups: Lookups[str, str] = Lookups(read, limit=2)
    asked = [asyncio.ensure_future(lookups(item)) for item in ("first", "a", "boom", "b")]
    await asyncio.sleep(0)
    release.set()
    outcomes = await asyncio.gather(*asked, return_exceptions=True)
    assert outcomes[0] == "firstfirst"
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes[1:3])
    assert outcomes[3] == "bb"
    assert await lookups("c") == "cc"


async def test_a_read_withdrawn_while_waiting_is_not_read_and_a_stopped_one_leaves_nobody_waiting() -> None:
    release = asyncio.Event()
    read = Reading(release)
    lookups: Lookups[str, str] = Lookups(read)
    first = asyncio.ensure_future(lookups("first"))
    await asyncio.sleep(0)
    withdrawn = asyncio.ensure_future(lookups("withdrawn"))
    kept = asyncio.ensure_future(lookups("kept"))
    await asyncio.sleep(0)
    withdrawn.cancel()
    release.set()
    assert (await first, await kept) == ("firstfirst", "keptkept")
    assert read.batches == [["first"], ["kept"]]
    # A read under way stopped (its caller, the loop) hands the waiting ones on, and the reader of
    # those stopped leaves none of them waiting.
    release.clear()
    first = asyncio.ensure_future(lookups("first"))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(lookups("waiting"))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.sleep(0)
    assert read.batches[-1] == ["waiting"]
    reader = lookups._reader
    assert reader is not None
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    assert await lookups("again") == "againagain"
