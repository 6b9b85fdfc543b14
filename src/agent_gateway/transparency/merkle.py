"""Merkle trees after RFC 9162 §2.1: hashes, inclusion and consistency proofs, and their checks.

A tree over leaves ``D[0:n]`` is stored as the hashes of its *complete
subtrees*: node ``(level, index)`` is the root of the ``2**level`` leaves
from ``index * 2**level``. Those never change once their last leaf is in, so
an append-only store can keep them. Every hash a proof needs is the root of a
range of leaves that starts on a boundary of its own size, which is the
right-to-left fold of at most one complete subtree per level: a proof needs
O(log n) stored nodes, fetched all at once through a :data:`Fetch`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

Node = tuple[int, int]
Range = tuple[int, int]
# Gives the stored hash of each node asked for (every one of them exists).
Fetch = Callable[[Sequence[Node]], Awaitable[Mapping[Node, bytes]]]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(Exception):
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


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The leaf ranges whose roots are the inclusion proof of leaf ``index`` in a tree of ``size``
    (RFC 9162 §2.1.3.1, PATH), in proof order."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    ranges = []
    begin, end = 0, size
    while end - begin > 1:
        middle = begin + _split(end - begin)
        if index < middle:
            ranges.append((middle, end))
            end = middle
        else:
            ranges.append((begin, middle))
            begin = middle
    return ranges[::-1]


def consistency_ranges(old: int, new: int) -> list[Range]:
    """The leaf ranges whose roots are the consistency proof from a tree of ``old`` to one of ``new``
    (RFC 9162 §2.1.4.1, SUBPROOF), in proof order; none when the sizes are equal."""
    if not 0 < old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    ranges = []
    begin, end, whole = 0, new, True
    # ``old`` counts leaves from ``begin``; ``whole`` is SUBPROOF's b (the old root is known).
    while old != end - begin:
        middle = begin + _split(end - begin)
        if old <= middle - begin:
            ranges.append((middle, end))
            end = middle
        else:
            ranges.append((begin, middle))
            old -= middle - begin
            begin, whole = middle, False
    if not whole:
        ranges.append((begin, end))
    return ranges[::-1]


async def range_roots(fetch: Fetch, ranges: Sequence[Range]) -> list[bytes]:
    """The root of each range, from stored subtrees fetched in one call."""
    plans = [subtrees(begin, end) for begin, end in ranges]
    stored = await fetch(sorted({node for plan in plans for node in plan}))
    return [fold([stored[node] for node in plan]) for plan in plans]


async def root(fetch: Fetch, size: int) -> bytes:
    """The root hash of the tree of ``size`` leaves (RFC 9162 MTH)."""
    if size == 0:
        return EMPTY_ROOT
    [hash_] = await range_roots(fetch, [(0, size)])
    return hash_


async def inclusion_proof(fetch: Fetch, index: int, size: int) -> list[bytes]:
    return await range_roots(fetch, inclusion_ranges(index, size))


async def consistency_proof(fetch: Fetch, old: int, new: int) -> list[bytes]:
    return await range_roots(fetch, consistency_ranges(old, new))


def appended(frontier: Sequence[bytes], size: int, leaves: Iterable[bytes]) -> list[tuple[Node, bytes]]:
    """The nodes that appending ``leaves`` (leaf hashes) to a tree of ``size`` completes, leaves
    included, in order; ``frontier`` holds the hashes of ``subtrees(0, size)``."""
    stack = list(zip(subtrees(0, size), frontier, strict=True))
    completed = []
    for hash_ in leaves:
        node = (0, size)
        size += 1
        completed.append((node, hash_))
        # Two neighbours of one level make a complete node of the next (they are its halves).
        while len(stack) and stack[-1][0][0] == node[0]:
            (level, index), left = stack.pop()
            node, hash_ = (level + 1, index >> 1), node_hash(left, hash_)
            completed.append((node, hash_))
        stack.append((node, hash_))
    return completed


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
