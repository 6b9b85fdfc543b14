"""The Run ledger's tree grows after its entries commit (``tree.Tree.integrate``): a Run's start
writes its entry alone, and the tree catches up with the committed entries in batches, before
anything reads it and when the Signal Worker finds the queue empty; the same tree whoever grows
it, on both backends."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from agent_gateway import clock, ids, merkle
from agent_gateway.ledger.service import Ledger
from agent_gateway.store import tables
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import ledger as queries
from agent_gateway.store.queries import tree
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Signal
from agent_gateway.store.window import Window
from tests.signals.conftest import GatewayFactory, Recording, emit, finished, until
from tests.test_merkle import mth

SIGNAL = Signal("5d6f3c1e-0000-4000-8000-0000000000f0", "k", {"a": 1}, clock.now_iso(), "processing", None)


async def nodes(store: Store) -> int:
    """How many nodes of the tree are stored (read without growing it)."""
    async with store.read() as conn:
        return int((await conn.execute(sa.select(sa.func.count()).select_from(tables.ledger_tree))).scalar_one())


async def started(ledger: Ledger, count: int) -> None:
    """``count`` Runs started, each in a transaction of its own, as the Signal Worker starts them."""
    for _ in range(count):
        run = Run(ids.new(), SIGNAL.id, "s", "p", "running", None, None, None)
        async with ledger.store.transaction() as conn:
            await ledger.started(conn, SIGNAL, [run], clock.now_iso())


async def leaves(store: Store) -> list[bytes]:
    return [entry.leaf for entry in await queries.window(store, window=Window(after=0, limit=200))]


async def grown(store: Store) -> bool:
    """Whether the stored tree holds every entry (read without growing it)."""
    [(size, logged)] = await store.fetch(queries.TREE._queries.behind, bits=tree.LEVEL_BITS)  # type: ignore[arg-type]
    return int(size) == int(logged)


async def test_a_runs_start_writes_its_entry_alone_and_a_reader_grows_the_tree_first(store: Store) -> None:
    ledger = Ledger(store)
    await ledger.record_instructions({"handlers": []})  # grown at once: one leaf, one node
    assert await nodes(store) == 1 and await grown(store)
    for count in (1, 4):
        await started(ledger, count)
        assert await nodes(store) == 1 and not await grown(store)  # the entries only
    # Anything that reads the tree grows it first: its size, its root, a proof of the newest entry.
    assert await queries.TREE.size(store) == 6
    assert await grown(store)
    assert await merkle.root(queries.TREE.fetcher(store), 6) == mth(await leaves(store))
    await started(ledger, 1)
    read = await queries.TREE.read_inclusion(store, number=7, size=None)
    assert (read.leaf_index, read.size) == (6, 7)
    hashes = await merkle.inclusion_proof(read.fetch, 6, 7)
    merkle.verify_inclusion(6, 7, merkle.leaf_hash((await leaves(store))[6]), hashes, mth(await leaves(store)))


async def test_the_tree_catches_up_in_batches(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(store)
    await ledger.record_instructions({"handlers": []})
    await started(ledger, 10)
    monkeypatch.setattr(tree, "INTEGRATE_BATCH", 3)
    assert await queries.TREE.integrate(store) == 11
    assert await merkle.root(queries.TREE.fetcher(store), 11) == mth(await leaves(store))
    # Each batch a transaction of its own: the tree after 1 + 3 * k leaves is whole too.
    for size in (1, 4, 7, 10, 11):
        assert await merkle.root(queries.TREE.fetcher(store), size) == mth((await leaves(store))[:size])


async def test_growers_in_two_processes_at_once_grow_one_tree(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers of two Stores (two connection pools, as two processes have) grow the tree at once, in
    small batches: none writes a node twice (each node is stored once, by its key) and the tree is whole."""
    ledger = Ledger(store)
    await ledger.record_instructions({"handlers": []})
    await started(ledger, 40)
    monkeypatch.setattr(tree, "INTEGRATE_BATCH", 4)
    other = Store(store.url)
    try:
        sizes = await asyncio.gather(*(queries.TREE.size(each) for each in (store, other, store, other)))
    finally:
        await other.close()
    assert sizes == [41] * 4
    assert await merkle.root(queries.TREE.fetcher(store), 41) == mth(await leaves(store))
    # A complete tree of 41 leaves: 41 + 20 + 10 + 5 + 2 + 1 nodes.
    assert await nodes(store) == 79


async def test_the_signal_worker_grows_the_tree_once_the_queue_stays_empty(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Recording(), handlers={"note": {"template": "A note: {{ text }}"}})
    for text in ("one", "two", "three"):
        assert (await finished(gateway.store, await emit(gateway.store, "note", {"text": text}))).state == "done"
    # No reader asks: the worker grows it while the queue stays empty.
    await until(lambda: grown(gateway.store))
    assert await nodes(gateway.store) == 7  # 4 leaves: 4 + 2 + 1
    assert await merkle.root(queries.TREE.fetcher(gateway.store), 4) == mth(await leaves(gateway.store))
