"""The stored Merkle tree: grown with every committed Decision, in seq order, and built by migration 0002."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from agent_gateway import deployment, errors, merkle
from agent_gateway.decisions import service
from agent_gateway.decisions.service import DecisionNotFound
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store, create_engine
from agent_gateway.store.queries import tree
from agent_gateway.store.window import Window
from agent_gateway.transparency import service as transparency
from tests import served
from tests.test_merkle import mth, path, subproof

pytestmark = pytest.mark.processes

identity = SigningIdentity(keys.generate_pem("ed25519"))


async def assert_tree_is_the_log(store: Store) -> list[service.Decision]:
    """The stored tree is exactly the RFC 9162 tree over the log's JWS, in seq order."""
    log = await service.read(store, Window(after=0, limit=200))
    assert await tree.DECISIONS.size(store) == len(log)
    for index, decision in enumerate(log):
        assert (await tree.DECISIONS.read_inclusion(store, number=decision.seq, size=None)).leaf_index == index
    leaves = [decision.jws.encode() for decision in log]
    fetch = tree.DECISIONS.fetcher(store)
    root = await merkle.root(fetch, len(log))
    assert root == mth(leaves)
    for index in range(len(log)):
        proof = await merkle.inclusion_proof(fetch, index, len(log))
        merkle.verify_inclusion(index, len(log), merkle.leaf_hash(leaves[index]), proof, root)
    return log


async def test_every_committed_decision_is_a_leaf_in_seq_order_across_processes(database_url: str) -> None:
    stores = [Store(database_url) for _ in range(3)]

    async def publish_alone(store: Store, name: str) -> None:
        for index in range(8):
            async with store.transaction() as conn:
                await service.publish(conn, identity, f"{name}-{index}")

    async def publish_batched(store: Store, name: str) -> None:
        publisher = service.Publisher(store, identity)
        await asyncio.gather(*(publisher.publish(f"{name}-{index}") for index in range(12)))

    async def rolled_back(store: Store) -> None:
        class Abandon(Exception):
            pass

        with pytest.raises(Abandon):
            async with store.transaction() as conn:
                await service.publish(conn, identity, "never committed")
                raise Abandon

    try:
        await asyncio.gather(
            publish_alone(stores[0], "a"), publish_batched(stores[1], "b"), publish_alone(stores[2], "c"), rolled_back(stores[0])
        )
        log = await assert_tree_is_the_log(stores[0])
        assert len(log) == 28 and "never committed" not in [d.statement for d in log]
    finally:
        for store in stores:
            await store.close()


async def test_a_publisher_reads_the_frontier_again_once_another_has_published(database_url: str) -> None:
    """A Store grows the tree from the frontier its own last commit left, only while no other
    publisher has come between: here two Stores take turns, one of them rolls back, and each
    turn's tree must still be the log's."""
    first, second = Store(database_url), Store(database_url)

    class Abandon(Exception):
        pass

    async def publish(store: Store, count: int, *, commit: bool = True) -> None:
        with contextlib.suppress(Abandon):
            async with store.transaction() as conn:
                await service.publish_many(conn, identity, [f"turn-{n}" for n in range(count)])
                if not commit:
                    raise Abandon

    try:
        for store, count, commit in [
            (first, 3, True), (first, 2, True), (second, 5, True), (first, 1, True),
            (first, 4, False), (first, 2, True), (second, 1, False), (second, 3, True), (first, 7, True),
        ]:
            await publish(store, count, commit=commit)
            await assert_tree_is_the_log(first)
        assert await tree.DECISIONS.size(second) == 3 + 2 + 5 + 1 + 2 + 3 + 7
    finally:
        await first.close()
        await second.close()


def _run(url: str, coroutine_factory) -> object:  # type: ignore[no-untyped-def]
    async def main() -> object:
        engine = create_engine(url)
        try:
            return await coroutine_factory(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_migrate_from_0001_builds_the_tree_of_the_decisions_already_there(
    tmp_path: Path,
    empty_database_url: str,
) -> None:
    url = empty_database_url
    if url.startswith("sqlite"):
        migrate.create_sqlite_file(url)
    # A log written by revision 0001, with the gaps a rolled-back publish leaves.
    numbers = [1, 2, 4, 5, 6, 9, 10, 11, 12, 20]

    async def at_0001(engine) -> None:  # type: ignore[no-untyped-def]
        await migrate.upgrade(engine, "0001")
        rows = []
        for seq in numbers:
            payload = orjson.dumps({"seq": seq, "createdAt": "2026-11-21T23:03:30.123Z", "statement": f"s{seq}"})
            rows.append(
                {"seq": seq, "statement": f'"s{seq}"', "jws": identity.sign(payload, DECISION_TYP), "created_at": "2026-11-21T23:03:30.123Z"}
            )
        insert = sa.table("decisions", *(sa.column(name) for name in rows[0])).insert()
        async with engine.begin() as conn:
            await conn.execute(insert, rows)
            if conn.dialect.name == "postgresql":
                await conn.execute(sa.text("SELECT setval('decisions_seq_seq', 20)"))

    _run(url, at_0001)
    deployment.write(tmp_path / "d")
    result = served.run_cli(
        "migrate", config=tmp_path / "d" / "gateway.toml", env={"AGENT_GATEWAY_DATABASE_URL": url}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"upgraded from revision 0001 to {migrate.HEAD}"

    async def check() -> None:
        store = Store(url)
        try:
            log = await assert_tree_is_the_log(store)
            assert [d.seq for d in log] == numbers
            old_root = await merkle.root(tree.DECISIONS.fetcher(store), len(numbers))
            async with store.transaction() as conn:
                await service.publish_many(conn, identity, ["after", "the migration"])
            log = await assert_tree_is_the_log(store)
            assert [d.seq for d in log][-2:] == [21, 22]
            new_root = await merkle.root(tree.DECISIONS.fetcher(store), len(log))
            proof = await merkle.consistency_proof(tree.DECISIONS.fetcher(store), len(numbers), len(log))
            merkle.verify_consistency(len(numbers), len(log), old_root, new_root, proof)
        finally:
            await store.close()

    asyncio.run(check())


async def test_the_tree_is_right_after_every_batch_whatever_the_sizes(store: Store) -> None:
    """Every frontier shape (each bit pattern of the size up to 70) is read back and extended."""
    leaves: list[bytes] = []
    batch = 1
    while len(leaves) < 70:
        async with store.transaction() as conn:
            published = await service.publish_many(conn, identity, [f"s{len(leaves) + n}" for n in range(batch)])
        leaves.extend(decision.jws.encode() for decision in published)
        assert await tree.DECISIONS.size(store) == len(leaves)
        assert await merkle.root(tree.DECISIONS.fetcher(store), len(leaves)) == mth(leaves)
        batch = batch % 5 + 1


async def test_one_statement_reads_every_node_of_every_proof(store: Store) -> None:
    """The proof statements read a superset of each proof's nodes chosen by SQL from the leaf and
    the sizes: every inclusion and consistency proof of a log of 37 (6 levels, every frontier
    shape on the way) against the RFC's definitions, and the errors from the same read."""
    async with store.transaction() as conn:
        published = await service.publish_many(conn, identity, [f"p{n}" for n in range(37)])
    leaves = [decision.jws.encode() for decision in published]
    for size in range(1, 38):
        for index, decision in enumerate(published[:size]):
            proof = await transparency.inclusion(store, decision.seq, size)
            assert (proof.index, proof.tree_size, proof.hashes) == (index, size, path(index, leaves[:size]))
        for old in range(1, size + 1):
            expected = subproof(old, leaves[:size], True) if old < size else []
            assert await transparency.consistency(store, old, size) == (size, expected)
    assert (await transparency.inclusion(store, published[5].seq, None)).hashes == path(5, leaves)
    assert await transparency.consistency(store, 5, None) == (37, subproof(5, leaves, True))
    with pytest.raises(DecisionNotFound):
        await transparency.inclusion(store, published[-1].seq + 1, None)
    for seq, size in [(published[5].seq, 5), (published[5].seq, 38)]:
        with pytest.raises(errors.InvalidInput):
            await transparency.inclusion(store, seq, size)
    for old, new in [(None, None), (0, 3), (4, 3), (1, 38), (38, None)]:
        with pytest.raises(errors.InvalidInput):
            await transparency.consistency(store, old, new)
