"""Merkle trees after RFC 9162 §2.1: hashes, inclusion and consistency proofs, and their checks.

A tree over leaves ``D[0:n]`` is stored as the hashes of its *complete
subtrees*: node ``(level, index)`` is the root of the ``2**level`` leaves
from ``index * 2**level``. Those never change once their last leaf is in, so
an append-only store can keep them. Every hash a proof needs is the root of a
range of leaves that starts on a boundary of its own size, which is the
right-to-left fold of at most one complete subtree per level: a proof needs
O(log n) stored nodes, fetched all at once through a :data:`Fetch`.

Pure computation with no I/O of its own, so it sits beside ``clock`` and
``jsontext`` at the package top: the store's tree (``store.queries.tree``), its
migration, the transparency routes and the auditor all build on it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from agent_gateway import errors

Node = tuple[int, int]
# Gives the stored hash of each node asked for (every one of them exists).
Fetch = Callable[[Sequence[Node]], Awaitable[Mapping[Node, bytes]]]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(errors.GatewayError):
    """A proof does not prove what it is offered for; the message says how."""


def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x00 || data)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(size: int) -> int:
    """The largest power of two smaller than ``size`` (> 1): where MTH splits ``size`` leaves."""
    return 1 << ((size - 1).bit_length() - 1)


def subtrees(begin: int, end: int) -> list[Node]:
    """The complete subtrees that make up leaves ``[begin, end)``, left to right, each as large as fits."""
    nodes = []
    while begin < end:
        level = (end - begin).bit_length() - 1
        if begin:
            level = min(level, (begin & -begin).bit_length() - 1)
        nodes.append((level, begin >> level))
        begin += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """The root of a range from the roots of its :func:`subtrees`, when the range starts on a
    boundary of its own size (every range a proof names does): the subtrees shrink left to
    right, and MTH joins the rightmost first."""
    root = hashes[-1]
    for left in reversed(hashes[:-1]):
        root = node_hash(left, root)
    return root


@dataclasses.dataclass(frozen=True)
class Plan:
    """The stored nodes a proof is made of, in proof order: each is one hash of the proof,
    except ``nodes[border:border + width]``, the complete subtrees of the one range on the
    tree's right edge that no stored node covers, which fold into one hash."""

    nodes: list[Node]
    border: int = 0
    width: int = 1

    def hashes(self, stored: Mapping[Node, bytes]) -> list[bytes]:
        hashes = [stored[node] for node in self.nodes]
        if self.width > 1:
            hashes[self.border : self.border + self.width] = [fold(hashes[self.border : self.border + self.width])]
        return hashes


def _path(index: int, level: int, size: int) -> Plan:
    """The audit path of the complete node ``(level, index)`` in the tree of ``size`` leaves,
    bottom up (RFC 9162 §2.1.3.1, PATH, from that node instead of a leaf).

    Up to the level where the node's path meets the path of the last leaf, every sibling is
    a complete subtree, except the one just below it: the right-hand range up to ``size``
    (a fold of the subtrees of that range). From there up, the path is the right edge: its
    left siblings are complete, and a right sibling would begin past the last leaf.
    """
    last = (size - 1) >> level
    meet = (index ^ last).bit_length()
    nodes = [(level + v, (index >> v) ^ 1) for v in range(meet - 1)]
    border, width = len(nodes), 1
    if meet:
        edge = subtrees(((index >> (meet - 1)) | 1) << (level + meet - 1), size)
        nodes += edge
        width = len(edge)
    nodes += [(level + v, (index >> v) ^ 1) for v in range(meet, last.bit_length()) if (index >> v) & 1]
    return Plan(nodes, border, width)


def inclusion_plan(index: int, size: int) -> Plan:
    """The inclusion proof of leaf ``index`` in a tree of ``size`` (RFC 9162 §2.1.3.1)."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    return _path(index, 0, size)


def consistency_plan(old: int, new: int) -> Plan:
    """The consistency proof from a tree of ``old`` to one of ``new`` (RFC 9162 §2.1.4.1): the
    largest complete node that ends at ``old`` (left out when it is the old root), and its audit
    path in the new tree; nothing when the sizes are equal."""
    if not 0 < old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    if old == new:
        return Plan([])
    level = (old & -old).bit_length() - 1
    index = (old - 1) >> level
    path = _path(index, level, new)
    if not index:  # old is a power of two: its root is the node, which the verifier has
        return path
    return Plan([(level, index), *path.nodes], path.border + 1, path.width)


async def root(fetch: Fetch, size: int) -> bytes:
    """The root hash of the tree of ``size`` leaves (RFC 9162 MTH)."""
    if size == 0:
        return EMPTY_ROOT
    nodes = subtrees(0, size)
    stored = await fetch(nodes)
    return fold([stored[node] for node in nodes])


async def inclusion_proof(fetch: Fetch, index: int, size: int) -> list[bytes]:
    plan = inclusion_plan(index, size)
    return plan.hashes(await fetch(plan.nodes))


async def consistency_proof(fetch: Fetch, old: int, new: int) -> list[bytes]:
    plan = consistency_plan(old, new)
    return plan.hashes(await fetch(plan.nodes))


def appended(frontier: Sequence[bytes], size: int, leaves: Iterable[bytes]) -> tuple[list[tuple[Node, bytes]], list[bytes]]:
    """The nodes that appending ``leaves`` (leaf hashes) to a tree of ``size`` completes, leaves
    included, in order, and the frontier of the grown tree; ``frontier`` holds the hashes of
    ``subtrees(0, size)``."""
    # The frontier as a stack, the smallest subtree on top: one subtree per bit set in the size,
    # of that bit's level. A leaf completes a node of each level from 0 up to the lowest bit not
    # set: those subtrees are the top of the stack, each the left half of the next node up.
    if len(frontier) != size.bit_count():
        raise ValueError(f"a tree of {size} has a frontier of {size.bit_count()} subtrees, not {len(frontier)}")
    hashes = list(frontier)
    completed = []
    for hash_ in leaves:
        completed.append(((0, size), hash_))
        level = 0
        while size >> level & 1:
            hash_ = node_hash(hashes.pop(), hash_)
            level += 1
            completed.append(((level, size >> level), hash_))
        hashes.append(hash_)
        size += 1
    # What is left is the grown tree's subtrees(0, size), left to right.
    return completed, hashes


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` leads to from ``leaf`` at ``index`` in a tree of ``size``
    (RFC 9162 §2.1.3.2); raises :class:`ProofError` for a proof of the wrong shape."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of {size}")
    _check_hashes([leaf, *proof])
    fn, sn, hash_ = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            hash_ = node_hash(sibling, hash_)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            hash_ = node_hash(hash_, sibling)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short")
    return hash_


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root_: bytes) -> None:
    """Raise :class:`ProofError` unless ``proof`` puts ``leaf`` at ``index`` in the tree ``root_``."""
    if root_from_inclusion(index, size, leaf, proof) != root_:
        raise ProofError(f"the inclusion proof of leaf {index} does not lead to the root of the tree of {size}")


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows the tree ``old_root`` of ``old`` leaves is
    the beginning of the tree ``new_root`` of ``new`` (RFC 9162 §2.1.4.2)."""
    if old > new:
        raise ProofError(f"a tree of {new} cannot extend one of {old}")
    _check_hashes(proof)
    if old == new:
        if proof or old_root != new_root:
            raise ProofError(f"two different trees of {old}")
        return
    if old == 0:
        if proof:
            raise ProofError("the empty tree has no consistency proof")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old & (old - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for hash_ in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(hash_, fr), node_hash(hash_, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, hash_)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError(f"the consistency proof does not lead to the old root of {old}")
    if sr != new_root:
        raise ProofError(f"the consistency proof does not lead to the new root of {new}")


def _check_hashes(hashes: Iterable[bytes]) -> None:
    if any(len(hash_) != HASH_SIZE for hash_ in hashes):
        raise ProofError(f"a hash in the proof is not {HASH_SIZE} bytes")


def b64(hashes: Iterable[bytes]) -> list[str]:
    """A proof's hashes as the routes and receipts give them: standard base64 each."""
    return [base64.b64encode(hash_).decode() for hash_ in hashes]
