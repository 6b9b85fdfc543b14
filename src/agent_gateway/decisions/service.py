"""Decisions: the one global, numbered, append-only log of signed Statements (spec: Decision).

Every function takes a connection inside the caller's transaction; a
:class:`Publisher` (the Agent route's) owns its transactions. Nothing updates
or removes a Decision, and publishing one emits no Signal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, jsontext
from agent_gateway.ops import metrics
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.store import direct, engine
from agent_gateway.store.batch import Batcher
from agent_gateway.store.engine import Store, on_commit
from agent_gateway.store.queries import decisions as queries
from agent_gateway.store.queries import tree
from agent_gateway.store.queries.decisions import Decision
from agent_gateway.store.window import Window
from agent_gateway.webhooks import outbox

__all__ = ["Decision", "DecisionNotFound", "Publisher", "get", "publish", "publish_many", "read"]


class DecisionNotFound(errors.NotFound):
    """No Decision has that number."""


async def publish(conn: AsyncConnection, identity: SigningIdentity, statement: str) -> Decision:
    """Append ``statement`` to the log and return the signed Decision (spec: route semantics 4).

    The number is drawn first, the timestamp second, the signature last, all
    in the caller's transaction; the payload is ``{seq, createdAt,
    statement}`` in that order under typ ``service-decision+jws``, and the
    stored ``createdAt`` is the very string that was signed. Concurrent
    publishers never share a number (see ``store.queries.decisions.draw_numbers``).
    Raises :class:`errors.InvalidInput` for an empty Statement and
    ``AlgorithmMismatch`` when the configured algorithm cannot be performed
    by the key; the caller's transaction then rolls back.
    """
    [decision] = await publish_many(conn, identity, [statement])
    return decision


async def publish_many(conn: AsyncConnection, identity: SigningIdentity, statements: Sequence[str]) -> list[Decision]:
    """:func:`publish` for each of ``statements``, numbered in that order, in the caller's transaction."""
    _check(statements)
    return await _write(conn, identity, await queries.draw_numbers(conn, len(statements)), statements)


def _check(statements: Sequence[str]) -> None:
    for statement in statements:
        if not isinstance(statement, str) or not statement:
            raise errors.InvalidInput("statement must be a non-empty string")


async def _write(
    conn: AsyncConnection | direct.Alone, identity: SigningIdentity, numbers: Sequence[int], statements: Sequence[str]
) -> list[Decision]:
    """Sign ``statements`` numbered ``numbers`` and write them, with the tree's growth, in one go."""
    published = []
    for seq, statement in zip(numbers, statements, strict=True):
        created_at = clock.now_iso()
        payload = orjson.dumps({"seq": seq, "createdAt": created_at, "statement": statement})
        published.append(Decision(seq, statement, identity.sign(payload, DECISION_TYP), created_at))
    # The Merkle tree grows in the same transaction, leaves in seq order (see store.queries.tree).
    growth = await tree.DECISIONS.growth(conn, numbers, [decision.jws.encode() for decision in published])
    await queries.insert(conn, published, growth, outbox.decision_deliveries(conn, published), channel=outbox.CHANNEL)
    return published


class Publisher:
    """Publishes the Statements of concurrent requests, many to a transaction (see ``store.batch``);
    on PostgreSQL many to a statement, which commits alone (``store.queries.decisions.Lease``)."""

    def __init__(self, store: Store, identity: SigningIdentity) -> None:
        self._store = store
        self._identity = identity
        self._lease = queries.Lease()
        self._batcher: Batcher[str, Decision] = (
            Batcher(  # type: ignore[arg-type]
                store, self._publish_alone, alone=True, idle=self._lease.release, linger=queries.LEASE_LINGER_S
            )
            if store.dialect == "postgresql"
            else Batcher(store, self._publish_many)
        )

    async def publish(self, statement: str) -> Decision:
        """:func:`publish` in a transaction of its own, shared with whoever publishes at the same time."""
        return await self._batcher.submit(statement)

    async def _publish_many(self, conn: AsyncConnection, statements: Sequence[str]) -> list[Decision]:
        published = await publish_many(conn, self._identity, statements)
        self._count(conn, published)
        return published

    async def _publish_alone(self, conn: direct.Alone, statements: Sequence[str]) -> list[Decision]:
        with engine.committing(conn, self._store):
            try:
                _check(statements)
                published = await _write(conn, self._identity, await self._lease.draw(conn, len(statements)), statements)
            except BaseException:
                self._lease.failed(conn)
                raise
            self._count(conn, published)
        await self._lease.written(conn, published[-1].seq)
        return published

    def _count(self, conn: AsyncConnection | direct.Alone, published: Sequence[Decision]) -> None:
        # Counted once a batch commits, in one increment (each takes prometheus_client's lock).
        on_commit(conn, functools.partial(metrics.decisions.inc, len(published)))


async def get(store: Store, seq: int) -> Decision:
    """The Decision numbered ``seq``; raises :class:`DecisionNotFound` (not evidence of a withheld one)."""
    decision = await queries.get(store, seq=seq)
    if decision is None:
        raise DecisionNotFound()
    return decision


async def read(store: Store, window: Window) -> list[Decision]:
    """The Decisions of a cursor window, ascending by number (spec: Cursor-window reads)."""
    return await queries.window(store, window=window)


async def page(store: Store, window: Window) -> bytes:
    """The JSON body of ``GET /decisions``: the Decisions of a cursor window (:func:`read`)."""
    return jsontext.dumps({"decisions": await queries.window_records(store, window=window)})
