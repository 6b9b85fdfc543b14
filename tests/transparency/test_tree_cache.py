"""The nodes a Store caches for its proofs: only committed complete subtrees, never stale, bounded."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence

import pytest

from agent_gateway import merkle
from agent_gateway.decisions import service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import tree
from agent_gateway.store.window import Window
from agent_gateway.transparency import service as transparency
from tests.test_merkle import mth, path, subproof
from tests.transparency.test_tree import identity

pytestmark = pytest.mark.processes

# Small levels and steps, so that logs of tens of Decisions fill the cache a little at a time and
# move its level up; the last is the default (a tree this small is then below the cached levels).
LEVELS = [(0, 1, 1), (1, 2, 2), (2, 3, 1 << 9), (tree.CACHE_MIN_LEVEL, tree.CACHE_LEVELS, tree.CACHE_STEP)]

# Appends Decisions from a process of its own: ``python -c APPEND URL COUNT``.
APPEND = """
import asyncio, sys
from agent_gateway.decisions import service
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.engine import Store

async def main(url, count):
    store, signer = Store(url), SigningIdentity(keys.generate_pem("ed25519"))
    try:
        for first in range(0, count, 3):
            async with store.transaction() as conn:
                await service.publish_many(conn, signer, [f"other {n}" for n in range(first, min(first + 3, count))])
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@pytest.fixture(params=LEVELS, ids=lambda levels: "levels{}+{}-step{}".format(*levels))
def levels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    for name, value in zip(["CACHE_MIN_LEVEL", "CACHE_LEVELS", "CACHE_STEP"], request.param, strict=True):
        monkeypatch.setattr(tree, name, value)
    return request.param


async def leaves(store: Store) -> list[bytes]:
    return [decision.jws.encode() for decision in await service.read(store, Window(after=0, limit=200))]


def assert_cache_is_the_tree(cached: tree.Cached, log: Sequence[bytes]) -> None:
    """Every cached node is a complete subtree of the cached size, of a cached level, and right."""
    assert cached.size <= len(log)
    assert len(cached.hashes) < 2 ** (tree.CACHE_LEVELS + 1)
    for (level, index), hash_ in cached.hashes.items():
        assert level >= cached.level and (index + 1) << level <= cached.size
        assert hash_ == mth(log[index << level : (index + 1) << level])


async def assert_proofs(store: Store, log: Sequence[bytes], sizes: Sequence[int]) -> None:
    """Inclusion and consistency proofs of the trees of ``sizes``, as the RFC defines them."""
    numbers = [decision.seq for decision in await service.read(store, Window(after=0, limit=200))]
    for size in sizes:
        for index in range(size):
            proof = await transparency.inclusion(store, numbers[index], size)
            assert proof.hashes == path(index, log[:size])
        for old in range(1, size):
            assert await transparency.consistency(store, old, size) == (size, subproof(old, log[:size], True))


async def test_proofs_are_the_rfc_s_as_the_tree_grows_and_the_cache_with_it(store: Store, levels: tuple[int, int, int]) -> None:
    log: list[bytes] = []
    batch = 1
    while len(log) < 70:
        async with store.transaction() as conn:
            published = await service.publish_many(conn, identity, [f"g{len(log) + n}" for n in range(batch)])
        log.extend(decision.jws.encode() for decision in published)
        await assert_proofs(store, log, [len(log)])
        assert_cache_is_the_tree(tree.DECISIONS.cached(store), log)
        batch = batch % 7 + 3
    # Smaller trees than the cached size take their nodes from the same cache.
    await assert_proofs(store, log, [1, 13, 32, 33, 64])
    assert tree.DECISIONS.cached(store).size == len(log)
    if levels[1] < 6:  # 70 leaves are 7 levels: the cache moved its level up to keep its bound
        assert tree.DECISIONS.cached(store).level == max(levels[0], 7 - levels[1])


async def test_a_rolled_back_append_leaves_nothing_in_the_cache(database_url: str, levels: tuple[int, int, int]) -> None:
    reader, writer = Store(database_url), Store(database_url)

    class Abandon(Exception):
        pass

    try:
        async with writer.transaction() as conn:
            await service.publish_many(conn, identity, [f"kept {n}" for n in range(5)])
        await assert_proofs(reader, await leaves(writer), [5])
        with pytest.raises(Abandon):
            async with writer.transaction() as conn:
                await service.publish_many(conn, identity, [f"never {n}" for n in range(40)])
                # Proofs while those are written but not committed: the tree the reader sees is 5.
                assert (await transparency.inclusion(reader, 1, None)).tree_size == 5
                assert await transparency.consistency(reader, 2, None) == (5, subproof(2, (await leaves(reader))[:5], True))
                raise Abandon
        async with writer.transaction() as conn:
            await service.publish_many(conn, identity, [f"instead {n}" for n in range(40)])
        log = await leaves(writer)
        await assert_proofs(reader, log, [len(log)])
        assert_cache_is_the_tree(tree.DECISIONS.cached(reader), log)
    finally:
        await reader.close()
        await writer.close()


async def test_proofs_while_another_process_appends(database_url: str, levels: tuple[int, int, int]) -> None:
    """Proofs of the current tree (its size read fresh each time) while another process appends;
    each is checked, afterwards, against the RFC tree of the size it names."""
    store = Store(database_url)
    answered: list[tuple[str, int, int, list[bytes]]] = []
    other = None
    try:
        async with store.transaction() as conn:
            await service.publish_many(conn, identity, ["first", "second"])
        other = await asyncio.create_subprocess_exec(sys.executable, "-c", APPEND, database_url, "60")
        appended = asyncio.ensure_future(other.wait())
        draw = random.Random(15)
        while not appended.done() or len(answered) < 40:
            size = await tree.DECISIONS.size(store)
            proof = await transparency.inclusion(store, draw.randint(1, size), None)
            answered.append(("inclusion", proof.index, proof.tree_size, proof.hashes))
            old = draw.randint(1, size)
            new, hashes = await transparency.consistency(store, old, None)
            answered.append(("consistency", old, new, hashes))
            await asyncio.sleep(0.005)
        assert other.returncode == 0
        log = await leaves(store)
        assert len(log) == 62
        assert len({size for _, _, size, _ in answered}) > 1, "the tree grew while proofs were asked"
        for kind, first, size, hashes in answered:
            expected = path(first, log[:size]) if kind == "inclusion" else subproof(first, log[:size], True) if first < size else []
            assert hashes == expected, (kind, first, size)
        assert_cache_is_the_tree(tree.DECISIONS.cached(store), log)
        assert await merkle.root(tree.DECISIONS.fetcher(store), len(log)) == mth(log)
    finally:
        if other is not None and other.returncode is None:
            other.kill()
            await other.wait()
        await store.close()
