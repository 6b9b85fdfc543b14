"""The Merkle trees over the logs (the Decision log, the Run ledger): the stored hashes of
their complete subtrees, one table per log, the same code for each (:class:`Tree`).

In the Decision log leaf ``i`` is the ``i``-th Decision by ``seq``; its data is the Decision's JWS.
(The Run ledger's is ``store.queries.ledger``'s, and the same holds of it with its own lock.)
The tree grows in the transaction that writes its Decisions (see
``decisions.service.publish_many``), after their numbers are drawn: the lock
that orders publishers (``store.queries.decisions.draw_numbers``) orders leaves too,
so leaf order is ``seq`` order in every process, and a rolled-back publish
leaves no leaf. Nodes are written once and never change (see
``merkle``), so reads need no transaction: a tree size read
first names nodes that are all there.

The Run ledger's tree is grown after its entries commit instead (:meth:`Tree.integrate`, as
Trillian integrates what its sequencer numbered): a Run's start writes its entry only, and the
tree catches up with the committed entries in batches, when the Signal Worker finds the queue
empty and before anything reads the tree (its size, a proof, a checkpoint). Entries are
committed in number order (their writers' lock), so what a reader sees of them is a prefix,
and the nodes grown from it are the same whoever grows them.

For the same reason a process may keep nodes it has read: each Store keeps the
top levels of its tree (:class:`Cached`), and a proof reads from the database
only the nodes below them, which lie next to its leaf on a page or two, so its
database work hardly depends on the size of the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import weakref
from collections.abc import Mapping, Sequence

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import merkle
from agent_gateway.store import direct
from agent_gateway.store.engine import Store, on_commit

# A node's key is (the last leaf it covers) << LEVEL_BITS | its level: the nodes one
# append completes are adjacent, and every append writes at the end of the primary key.
LEVEL_BITS = 6

# The proof statement: a proof in one statement: the tree's size, the leaf's index (an inclusion proof), and
# the nodes the proof can need, whose keys follow from those. Which nodes are needed is settled by
# ``merkle`` from what is read; the statement reads a superset, of at most three
# nodes per level (tests/transparency/test_tree.py checks it against every proof of small trees):
#   - the sibling of each node on the path of the leaf (for a consistency proof: the old tree's
#     last leaf): (v, (leaf >> v) xor 1), the complete subtrees left and right of the path;
#   - the frontier of the size n: (v, (n >> v) - 1) for each bit v of n, what the incomplete
#     subtree on the right edge is made of;
#   - for a consistency proof from m, the largest node ending at leaf m: [m - (m & -m), m).
# The first row carries the sizes and the leaf (node NULL), the rest the nodes. SQLite has no
# xor: x xor 1 is x + 1 - 2 * (x & 1). Levels go up to n's highest bit, a recursive CTE on both.
# Nodes the reader has cached are not read: those at level :low or above that end before leaf
# :cached. Every complete node of level v ends before leaf (n >> v) << v, which shrinks as v
# grows: the levels stop at :low once that is within the cache, whatever the size of the tree.
#
# The frontier statement: the newest node tells the size n, and the frontier is the subtree (L, (n >> L) - 1)
# for each bit L set in n; one primary-key lookup each.


@dataclasses.dataclass(frozen=True)
class _Queries:
    """One tree's statements: its nodes in ``table``, its leaves' indexes by ``leaf`` (a SELECT of
    the index of the leaf numbered ``:number``, or no row)."""

    size: direct.Query
    insert: direct.Query
    nodes: dict[str, direct.Query]
    inclusion: direct.Query
    consistency: direct.Query
    frontier: dict[str, direct.Query]
    # A tree grown after its entries commit (Tree.integrate): its size with the number of
    # entries committed, and the data of the entries from leaf :start on, in order.
    behind: direct.Query | None
    leaves: direct.Query | None
    # Held by whoever grows such a tree on PostgreSQL: it conflicts with itself and with writes of
    # nodes, not with reads.
    lock: direct.Query

    @classmethod
    def of(cls, table: str, leaf: str, entries: Entries | None) -> _Queries:
        # The tree's size: the newest node is the last leaf's (its level the highest of that leaf).
        current = f"(SELECT coalesce((max(node) >> :bits) + 1, 0) FROM {table})"
        proof_nodes = (
            "l(v) AS (SELECT 0 UNION ALL SELECT v + 1 FROM l, p WHERE (p.n >> (v + 1)) > 0"
            " AND (v + 1 < :low OR ((p.n >> (v + 1)) << (v + 1)) > CAST(:cached AS BIGINT))), "
            "k(node) AS ("
            " SELECT ((((((p.leaf >> v) + 1 - 2 * ((p.leaf >> v) & 1)) + 1) << v) - 1) << :bits) | v FROM p, l"
            " UNION ALL SELECT ((((p.n >> v) << v) - 1) << :bits) | v FROM p, l WHERE (p.n >> v) & 1 = 1"
            " UNION ALL SELECT ((p.m - 1) << :bits) | v FROM p, l WHERE ((p.m >> v) << v) = p.m AND (p.m >> v) & 1 = 1) "
            "SELECT NULL, NULL, p.leaf, p.cur FROM p "
            f"UNION ALL SELECT t.node, t.hash, NULL, NULL FROM k JOIN {table} AS t ON t.node = k.node"
            " WHERE (k.node & ((1 << :bits) - 1)) < :low OR k.node >= (CAST(:cached AS BIGINT) << :bits)"
        )
        return cls(
            size=direct.Query(sa.text("SELECT " + current)),
            insert=direct.Query(
                sa.text(
                    f"INSERT INTO {table} (node, hash) "
                    "SELECT * FROM unnest(CAST(:keys AS bigint[]), CAST(:hashes AS bytea[]))"
                )
            ),
            # Many nodes in one statement: PostgreSQL takes an array, SQLite a JSON array.
            nodes={
                "postgresql": direct.Query(
                    sa.text(f"SELECT node, hash FROM {table} WHERE node = ANY(CAST(:keys AS BIGINT[]))")
                ),
                "sqlite": direct.Query(
                    sa.text(f"SELECT node, hash FROM {table} WHERE node IN (SELECT value FROM json_each(:keys))")
                ),
            },
            inclusion=direct.Query(
                sa.text(
                    f"WITH RECURSIVE s(leaf, cur) AS (SELECT ({leaf}), {current}), "
                    "p(leaf, m, n, cur) AS (SELECT leaf, CAST(NULL AS BIGINT), coalesce(CAST(:size AS BIGINT), cur), cur FROM s), "
                    + proof_nodes
                )
            ),
            consistency=direct.Query(
                sa.text(
                    f"WITH RECURSIVE s(cur) AS (SELECT {current}), "
                    "p(leaf, m, n, cur) AS (SELECT CAST(:old AS BIGINT) - 1, CAST(:old AS BIGINT), coalesce(CAST(:new AS BIGINT), cur), cur FROM s), "
                    + proof_nodes
                )
            ),
            frontier={
                "postgresql": direct.Query(
                    sa.text(
                        f"WITH s AS (SELECT coalesce((max(node) >> :bits) + 1, 0) AS n FROM {table}) "
                        "SELECT t.node, t.hash FROM s CROSS JOIN generate_series(0, 62) AS l "
                        f"JOIN {table} AS t ON t.node = ((((s.n >> l) << l) - 1) << :bits) | l "
                        "WHERE (s.n >> l) & 1 = 1"
                    )
                ),
                "sqlite": direct.Query(
                    sa.text(
                        f"WITH RECURSIVE s(n) AS (SELECT coalesce((max(node) >> :bits) + 1, 0) FROM {table}), "
                        "l(v) AS (SELECT 0 UNION ALL SELECT v + 1 FROM l, s WHERE (n >> (v + 1)) > 0) "
                        f"SELECT t.node, t.hash FROM l, s JOIN {table} AS t ON t.node = ((((n >> v) << v) - 1) << :bits) | v "
                        "WHERE (n >> v) & 1"
                    )
                ),
            },
            behind=None if entries is None else direct.Query(sa.text(f"SELECT {current}, ({entries.count})")),
            leaves=None if entries is None else direct.Query(sa.text(entries.data)),
            lock=direct.Query(sa.text(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")),
        )


@dataclasses.dataclass(frozen=True)
class Entries:
    """The entries of a log whose tree is grown after they commit (:meth:`Tree.integrate`): ``count``
    the SELECT of how many are committed, ``data`` the SELECT of the leaf data of those from leaf
    index ``:start`` on, in leaf order, at most ``:limit``."""

    count: str
    data: str


# The cache (:class:`Cached`) holds the levels of the tree from CACHE_MIN_LEVEL, or from the one
# that leaves CACHE_LEVELS above it when the tree is taller: at most 2 ** (CACHE_LEVELS + 1)
# nodes, about 7 MB. The 2 ** CACHE_MIN_LEVEL leaves' nodes below those are stored next to
# each other, on one or two pages, so caching them would save a proof little.
CACHE_MIN_LEVEL = 6
CACHE_LEVELS = 14
# A proof that finds the tree grown past the cache caches the nodes of at most CACHE_STEP << level
# more leaves (about 2 * CACHE_STEP nodes, a millisecond or two): the first proofs on a long log
# share loading it, none stalls on all of it (the statement reads what the cache lacks).
CACHE_STEP = 1 << 9


def key(node: merkle.Node) -> int:
    level, index = node
    return (((index + 1) << level) - 1) << LEVEL_BITS | level


def _node(key_: int) -> merkle.Node:
    level = key_ & ((1 << LEVEL_BITS) - 1)
    return level, (((key_ >> LEVEL_BITS) + 1) >> level) - 1


def _keys(dialect: str, nodes: Sequence[merkle.Node]) -> object:
    keys = [key(node) for node in nodes]
    return keys if dialect == "postgresql" else orjson.dumps(keys).decode()


def _hashes(rows: Sequence[Sequence[object]]) -> dict[merkle.Node, bytes]:
    return {_node(int(k)): bytes(h) for k, h in rows}  # type: ignore[arg-type, call-overload]


@dataclasses.dataclass(frozen=True)
class Growth:
    """What appending leaves writes: their first leaf index, and the nodes they complete as
    ``(key, hash)`` rows (written by ``store.queries.decisions.insert``, with the Decisions)."""

    first_leaf: int
    nodes: list[tuple[int, bytes]]


@dataclasses.dataclass(frozen=True)
class _Committed:
    """The tree as a growth this process committed left it, and the number the next Decision
    draws unless another publisher comes between."""

    next_number: int
    size: int
    frontier: list[bytes]


@dataclasses.dataclass(frozen=True)
class Cached:
    """Every stored node at ``level`` or above that ends within the tree's first ``size`` leaves.

    Only nodes read from the database at a size read from it are kept: complete subtrees of
    committed Decisions, which never change. The root of an incomplete tree is never a stored
    node, and the size of the tree is always read, never taken from here. ``hashes`` only ever
    gains nodes of ``level`` and above, so a reader holding this value may keep using it.
    """

    level: int
    size: int
    hashes: dict[merkle.Node, bytes]


class _Cache:
    """A Store's :class:`Cached`, extended as proofs find the tree grown."""

    def __init__(self) -> None:
        self.cached = Cached(CACHE_MIN_LEVEL, 0, {})
        self._extending = asyncio.Lock()

    async def extend(self, fetch: merkle.Fetch, size: int) -> None:
        """Read the nodes of the cached levels that the tree's first ``size`` leaves complete,
        or those of the next CACHE_STEP << level leaves when that is fewer."""
        if size <= self.cached.size:
            return  # the usual case, without waiting for the lock
        async with self._extending:
            cached = self.cached
            if size <= cached.size:
                return
            # The level of the tree's size: the cache stays within its bound as it fills up to it.
            level = max(CACHE_MIN_LEVEL, size.bit_length() - CACHE_LEVELS)
            size = min(size, cached.size + (CACHE_STEP << level))
            hashes = cached.hashes
            if level != cached.level:
                # A new dict: readers of the old value still find all of its nodes there.
                hashes = {node: hash_ for node, hash_ in hashes.items() if node[0] >= level}
            wanted = [(v, index) for v in range(level, size.bit_length()) for index in range(cached.size >> v, size >> v)]
            if wanted:
                hashes.update(await fetch(wanted))
            self.cached = Cached(level, size, hashes)


@dataclasses.dataclass(frozen=True)
class ProofRead:
    """What one proof statement reads: the tree's size now, the leaf's index (inclusion proofs;
    None when there is no such Decision), and stored nodes, every one the proof needs among
    them and the cache."""

    size: int
    leaf_index: int | None
    nodes: Mapping[merkle.Node, bytes]

    async def fetch(self, nodes: Sequence[merkle.Node]) -> Mapping[merkle.Node, bytes]:
        """The ``merkle.Fetch`` of a proof from what was read (``nodes`` are among it)."""
        return self.nodes


class _Read(dict[merkle.Node, bytes]):
    """The nodes a proof statement read, then the cache's (a ChainMap's lookups, which run in
    Python, took a tenth of a proof's time on a long log)."""

    def __init__(self, read: Mapping[merkle.Node, bytes], cached: Mapping[merkle.Node, bytes]) -> None:
        super().__init__(read)
        self.cached = cached

    def __missing__(self, node: merkle.Node) -> bytes:
        return self.cached[node]


@functools.lru_cache(maxsize=256)
def _sqlite_insert(table: str, count: int) -> str:
    # One statement for all of a growth's nodes: SQLite runs a multi-row VALUES list once, where
    # an executemany resets and steps a statement for each row (a third less time for 32 nodes).
    return f"INSERT INTO {table} (node, hash) VALUES " + ", ".join(["(?, ?)"] * count)


def _grow(size: int, frontier: list[bytes], numbers: Sequence[int], leaves: Sequence[bytes]) -> tuple[Growth, _Committed]:
    """The growth ``leaves`` numbered ``numbers`` make of the tree of ``size`` with ``frontier``, and the tree after it."""
    completed, grown = merkle.appended(frontier, size, [merkle.leaf_hash(leaf) for leaf in leaves])
    return Growth(size, [(key(node), hash_) for node, hash_ in completed]), _Committed(numbers[-1] + 1, size + len(leaves), grown)


# A tree grown after its entries commit catches up in transactions of at most this many leaves
# (a few tens of milliseconds each), so none holds the database's write lock long.
INTEGRATE_BATCH = 2048


class Tree:
    """One log's Merkle tree: its nodes in ``table``; ``leaf`` the SELECT of the leaf index of the
    entry numbered ``:number`` (no row when there is none). Every log's tree is this one code.

    ``entries``: given for a log whose tree is grown after its entries commit (:meth:`integrate`);
    without, the writers of the log grow it in their transactions (:meth:`growth`)."""

    def __init__(self, table: str, leaf: str, entries: Entries | None = None) -> None:
        self.table = table
        self._queries = _Queries.of(table, leaf, entries)
        # Per engine (one per Store): set only once the growth's transaction has committed.
        self._committed: weakref.WeakKeyDictionary[sa.Engine, _Committed] = weakref.WeakKeyDictionary()
        self._caches: weakref.WeakKeyDictionary[Store, _Cache] = weakref.WeakKeyDictionary()

    async def growth(self, conn: AsyncConnection, numbers: Sequence[int], leaves: Sequence[bytes]) -> Growth:
        """What appending the entries' ``leaves`` writes, in the caller's transaction after
        their ``numbers`` were drawn (for Decisions ``store.queries.decisions.draw_numbers``).

        The frontier is read (one statement) unless this process's last committed growth left it
        and those numbers follow on from that growth's: every writer draws numbers under the
        lock that orders them, so no other entry has been committed since, and the tree is as
        that growth left it. A rolled-back write leaves nothing here (it may burn numbers, which
        only makes the next growth read).
        """
        committed = self._committed.get(conn.sync_engine)
        if committed is not None and committed.next_number == numbers[0]:
            size, frontier = committed.size, committed.frontier
        else:
            size, frontier = await self._frontier(conn)
        growth, after = _grow(size, frontier, numbers, leaves)
        engine = conn.sync_engine
        on_commit(conn, lambda: self._committed.__setitem__(engine, after))
        return growth

    async def _frontier(self, conn: AsyncConnection) -> tuple[int, list[bytes]]:
        """The tree's size as ``conn`` sees it, and the hashes of its frontier (one statement)."""
        stored = _hashes(await direct.run(conn, self._queries.frontier[conn.dialect.name], bits=LEVEL_BITS))
        # The lowest subtree of the frontier ends at the newest leaf: (index + 1) << level is the size.
        size = max(((index + 1) << level for level, index in stored), default=0)
        return size, [stored[node] for node in merkle.subtrees(0, size)]

    async def integrate(self, store: Store) -> int:
        """Grow a tree grown after its entries commit (``entries``) to every committed entry; its size.

        One read when it is not behind; else transactions of at most :data:`INTEGRATE_BATCH` leaves,
        each reading the frontier and the entries after it and writing the nodes they complete. On
        PostgreSQL each holds a lock that only other growers of this tree wait for (readers and
        the log's writers do not), so no two write the same nodes; on SQLite the write lock does.
        """
        behind, leaves = self._queries.behind, self._queries.leaves
        if behind is None or leaves is None:
            return await self._stored_size(store)
        [(size, logged)] = await store.fetch(behind, bits=LEVEL_BITS)
        size, logged = int(size), int(logged)  # type: ignore[call-overload]
        while size < logged:
            async with store.transaction() as conn:
                if conn.dialect.name == "postgresql":
                    await direct.run(conn, self._queries.lock)
                size, frontier = await self._frontier(conn)
                rows = await direct.run(conn, leaves, start=size, limit=INTEGRATE_BATCH)
                if not rows:
                    break  # grown by another meanwhile, or fewer entries than read (none is ever deleted)
                growth, _ = _grow(size, frontier, range(size, size + len(rows)), [str(data).encode() for (data,) in rows])
                await self.write(conn, growth)
                size += len(rows)
        return size

    async def write(self, conn: AsyncConnection, growth: Growth) -> None:
        """Write ``growth``'s nodes (the Decision log does so on SQLite only: on PostgreSQL its
        Decisions' statement writes them, ``store.queries.decisions``; :meth:`integrate` on both)."""
        if conn.dialect.name == "postgresql":
            await direct.run(conn, self._queries.insert, keys=[k for k, _ in growth.nodes], hashes=[h for _, h in growth.nodes])
            return
        values = [value for node in growth.nodes for value in node]
        await direct.run_sqlite(conn, _sqlite_insert(self.table, len(growth.nodes)), values)

    async def size(self, store: Store) -> int:
        """How many leaves the tree holds (committed ones only; for a tree grown after its entries
        commit, once grown to them all)."""
        return await self.integrate(store)

    async def _stored_size(self, store: Store) -> int:
        [(count,)] = await store.fetch(self._queries.size, bits=LEVEL_BITS)
        return int(count)

    def cached(self, store: Store) -> Cached:
        """The nodes ``store``'s proofs take from memory (what they read is kept for the next)."""
        return self._cache(store).cached

    def _cache(self, store: Store) -> _Cache:
        cache = self._caches.get(store)
        if cache is None:
            cache = self._caches[store] = _Cache()
        return cache

    async def _read_proof(self, store: Store, query: direct.Query, **params: object) -> ProofRead:
        if self._queries.behind is not None:
            await self.integrate(store)  # a proof of every committed entry, against a tree of them all
        cache = self._cache(store)
        cached = cache.cached
        rows = await store.fetch(query, bits=LEVEL_BITS, low=cached.level, cached=cached.size, **params)
        [(leaf, size)] = [row[2:] for row in rows if row[0] is None]
        read = _hashes([row[:2] for row in rows if row[0] is not None])  # type: ignore[misc]
        # The next proofs take what this tree has added to the cached levels from memory.
        await cache.extend(self.fetcher(store), int(size))  # type: ignore[call-overload]
        return ProofRead(int(size), None if leaf is None else int(leaf), _Read(read, cached.hashes))  # type: ignore[call-overload]

    async def read_inclusion(self, store: Store, *, number: int, size: int | None) -> ProofRead:
        """In one statement, what the inclusion proof of the entry numbered ``number`` in the tree of
        ``size`` (None: the tree as it is) needs and the cache lacks; committed entries only."""
        return await self._read_proof(store, self._queries.inclusion, number=number, size=size)

    async def read_consistency(self, store: Store, *, old: int, new: int | None) -> ProofRead:
        """In one statement, what the consistency proof from the tree of ``old`` (at least 1) to
        that of ``new`` (None: the tree as it is) needs and the cache lacks."""
        return await self._read_proof(store, self._queries.consistency, old=old, new=new)

    def fetcher(self, store: Store) -> merkle.Fetch:
        """Reads stored nodes for ``merkle``, all of a proof's in one statement."""
        query = self._queries.nodes[store.dialect]

        async def fetch(nodes: Sequence[merkle.Node]) -> Mapping[merkle.Node, bytes]:
            return _hashes(await store.fetch(query, keys=_keys(store.dialect, nodes)))

        return fetch


# The Decision log's tree: leaf i is the i-th Decision by seq, its data the Decision's JWS.
DECISIONS = Tree("decision_tree", "SELECT CAST(leaf_index AS BIGINT) FROM decisions WHERE seq = :number")
