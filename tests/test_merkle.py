"""RFC 9162 hashing and proofs, against the published reference tree and a naive recursive MTH."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway import merkle

VECTORS = json.loads((Path(__file__).with_name("rfc6962_vectors.json")).read_text())
LEAVES = [bytes.fromhex(leaf) for leaf in VECTORS["leaves"]]
ROOTS = [bytes.fromhex(root) for root in VECTORS["roots"]]


def mth(leaves: Sequence[bytes]) -> bytes:
    """RFC 9162 §2.1.1, word for word."""
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return merkle.leaf_hash(leaves[0])
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))


def path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """RFC 9162 §2.1.3.1 PATH, word for word."""
    if len(leaves) == 1:
        return []
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    if m < k:
        return path(m, leaves[:k]) + [mth(leaves[k:])]
    return path(m - k, leaves[k:]) + [mth(leaves[:k])]


def subproof(m: int, leaves: Sequence[bytes], whole: bool) -> list[bytes]:
    """RFC 9162 §2.1.4.1 SUBPROOF, word for word."""
    if m == len(leaves):
        return [] if whole else [mth(leaves)]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    if m <= k:
        return subproof(m, leaves[:k], whole) + [mth(leaves[k:])]
    return subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]


class MemoryTree:
    """A tree grown by :func:`merkle.appended`, as the store grows its table."""

    def __init__(self) -> None:
        self.nodes: dict[merkle.Node, bytes] = {}
        self.size = 0
        self.fetched: list[int] = []

    def append(self, leaves: Sequence[bytes]) -> None:
        frontier = [self.nodes[node] for node in merkle.subtrees(0, self.size)]
        completed, grown = merkle.appended(frontier, self.size, [merkle.leaf_hash(leaf) for leaf in leaves])
        for node, hash_ in completed:
            assert node not in self.nodes, "a node is written once"
            self.nodes[node] = hash_
        self.size += len(leaves)
        assert grown == [self.nodes[node] for node in merkle.subtrees(0, self.size)], "the grown tree's frontier"

    async def fetch(self, nodes: Sequence[merkle.Node]) -> Mapping[merkle.Node, bytes]:
        self.fetched.append(len(nodes))
        return {node: self.nodes[node] for node in nodes}


def reference_tree(count: int) -> MemoryTree:
    tree = MemoryTree()
    tree.append(LEAVES[:count])
    return tree


def test_the_hashes_of_the_reference_tree() -> None:
    tree = reference_tree(8)
    for level, hashes in enumerate(VECTORS["nodes"]):
        for index, expected in enumerate(hashes):
            assert tree.nodes[(level, index)].hex() == expected
    assert len(tree.nodes) == 15


@pytest.mark.parametrize(("size", "subtrees"), [(0, 1), (1, 0), (6, 1), (7, 2), (7, 4)])
def test_a_frontier_of_the_wrong_length_is_refused(size: int, subtrees: int) -> None:
    # A tree of 7 leaves is three subtrees (4, 2 and 1 leaves): two or four hashes are not its frontier.
    with pytest.raises(ValueError, match=f"a tree of {size} has a frontier of {size.bit_count()} subtrees, not {subtrees}"):
        merkle.appended([merkle.EMPTY_ROOT] * subtrees, size, [merkle.leaf_hash(b"x")])


@pytest.mark.parametrize("size", range(9))
async def test_the_roots_of_the_reference_trees(size: int) -> None:
    assert await merkle.root(reference_tree(size).fetch, size) == ROOTS[size]
    # A tree grown one leaf at a time holds the very same nodes as one grown at once.
    grown = MemoryTree()
    for leaf in LEAVES[:size]:
        grown.append([leaf])
    assert grown.nodes == reference_tree(size).nodes


@pytest.mark.parametrize("vector", VECTORS["inclusion"], ids=lambda v: f"{v['leaf']}-of-{v['size']}")
async def test_inclusion_proofs_of_the_reference_tree(vector: dict) -> None:
    index, size = vector["leaf"] - 1, vector["size"]
    expected = [bytes.fromhex(h) for h in vector["proof"]]
    assert await merkle.inclusion_proof(reference_tree(8).fetch, index, size) == expected
    leaf = merkle.leaf_hash(LEAVES[index])
    merkle.verify_inclusion(index, size, leaf, expected, ROOTS[size])
    for wrong_index, wrong_size in [(index + 1, size), (index, size * 2), (index ^ 2, size)]:
        if (wrong_index, wrong_size) != (index, size):
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(wrong_index, wrong_size, leaf, expected, ROOTS[size])
    with pytest.raises(merkle.ProofError):
        merkle.verify_inclusion(index, size, leaf, [*expected, ROOTS[size]], ROOTS[size])
    for position in range(len(expected)):
        flipped = list(expected)
        flipped[position] = bytes([flipped[position][0] ^ 8]) + flipped[position][1:]
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(index, size, leaf, flipped, ROOTS[size])
    with pytest.raises(merkle.ProofError):
        merkle.verify_inclusion(index, size, merkle.leaf_hash(b"WrongLeaf"), expected, ROOTS[size])


@pytest.mark.parametrize("vector", VECTORS["consistency"], ids=lambda v: f"{v['from']}-to-{v['to']}")
async def test_consistency_proofs_of_the_reference_tree(vector: dict) -> None:
    old, new = vector["from"], vector["to"]
    expected = [bytes.fromhex(h) for h in vector["proof"]]
    assert await merkle.consistency_proof(reference_tree(8).fetch, old, new) == expected
    merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], expected)
    if not expected:
        return
    probes = [
        (old - 1, new, ROOTS[old], ROOTS[new], expected),
        (old + 1, new, ROOTS[old], ROOTS[new], expected),
        (old, new * 2, ROOTS[old], ROOTS[new], expected),
        (old, new, ROOTS[new], ROOTS[old], expected),
        (old, new, ROOTS[old], ROOTS[new], []),
        (old, new, ROOTS[old], ROOTS[new], expected[:-1]),
        (old, new, ROOTS[old], ROOTS[new], [*expected, ROOTS[new]]),
        (old, new, ROOTS[old], ROOTS[new], [expected[0], *expected]),
    ]
    for position in range(len(expected)):
        flipped = list(expected)
        flipped[position] = bytes([flipped[position][0] ^ 16]) + flipped[position][1:]
        probes.append((old, new, ROOTS[old], ROOTS[new], flipped))
    for probe in probes:
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(*probe)


def test_trees_of_equal_size_are_consistent_only_when_equal() -> None:
    merkle.verify_consistency(3, 3, ROOTS[3], ROOTS[3], [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(3, 3, ROOTS[3], ROOTS[4], [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(4, 3, ROOTS[4], ROOTS[3], [])


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """Leaves, and how they were appended (batch sizes), as a Publisher appends them."""
    leaves = draw(st.lists(st.binary(max_size=8), min_size=1, max_size=70))
    batches = []
    remaining = len(leaves)
    while remaining:
        batch = draw(st.integers(1, remaining))
        batches.append(batch)
        remaining -= batch
    return leaves, batches


@settings(max_examples=150, deadline=None)
@given(trees(), st.data())
async def test_proofs_of_any_tree_match_the_rfc_definitions(tree_and_batches, data: st.DataObject) -> None:
    leaves, batches = tree_and_batches
    tree = MemoryTree()
    done = 0
    for batch in batches:
        tree.append(leaves[done : done + batch])
        done += batch
    size = data.draw(st.integers(1, len(leaves)))
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(1, size))
    root = mth(leaves[:size])
    assert await merkle.root(tree.fetch, size) == root

    inclusion = await merkle.inclusion_proof(tree.fetch, index, size)
    assert inclusion == path(index, leaves[:size])
    merkle.verify_inclusion(index, size, merkle.leaf_hash(leaves[index]), inclusion, root)

    consistency = await merkle.consistency_proof(tree.fetch, old, size)
    assert consistency == (subproof(old, leaves[:size], True) if old < size else [])
    merkle.verify_consistency(old, size, mth(leaves[:old]), root, consistency)


async def test_a_proof_reads_a_logarithmic_number_of_nodes_in_one_fetch() -> None:
    tree = MemoryTree()
    tree.append([n.to_bytes(4, "big") for n in range(1000)])
    for size in (999, 1000):
        tree.fetched.clear()
        await merkle.inclusion_proof(tree.fetch, 0, size)
        await merkle.consistency_proof(tree.fetch, 1, size)
        assert len(tree.fetched) == 2 and all(count <= 2 * 10 for count in tree.fetched)


async def test_every_proof_of_every_tree_up_to_65_leaves_matches_the_rfc_definitions() -> None:
    """Exhaustively, where the proof's shape changes (the audit path meets the right edge at
    every level, the right-hand range folds from one to six subtrees)."""
    leaves = [n.to_bytes(2, "big") for n in range(65)]
    tree = MemoryTree()
    tree.append(leaves)
    for size in range(1, 66):
        for index in range(size):
            assert await merkle.inclusion_proof(tree.fetch, index, size) == path(index, leaves[:size])
        for old in range(1, size + 1):
            expected = subproof(old, leaves[:size], True) if old < size else []
            assert await merkle.consistency_proof(tree.fetch, old, size) == expected
