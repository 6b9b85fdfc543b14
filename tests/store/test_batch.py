"""Group commit (store.batch): many items to a transaction, each caller its own outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.decisions import service
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.batch import Batcher
from agent_gateway.store.engine import Store
from agent_gateway.store.window import Window

identity = SigningIdentity(keys.generate_pem("ed25519"))


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
