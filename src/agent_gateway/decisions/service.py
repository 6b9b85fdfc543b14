"""Decisions: the one global, numbered, append-only log of signed Statements (spec: Decision).

Every function takes a connection inside the caller's transaction. Nothing
updates or removes a Decision, and publishing one emits no Signal.
"""

from __future__ import annotations

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.store import decisions as queries
from agent_gateway.store.decisions import Decision
from agent_gateway.store.engine import Store
from agent_gateway.store.window import Window

__all__ = ["Decision", "DecisionNotFound", "get", "publish", "read"]


class DecisionNotFound(errors.NotFound):
    """No Decision has that number."""


async def publish(conn: AsyncConnection, identity: SigningIdentity, statement: str) -> Decision:
    """Append ``statement`` to the log and return the signed Decision (spec: route semantics 4).

    The number is drawn first, the timestamp second, the signature last, all
    in the caller's transaction; the payload is ``{seq, createdAt,
    statement}`` in that order under typ ``service-decision+jws``, and the
    stored ``createdAt`` is the very string that was signed. Concurrent
    publishers never share a number (see ``store.decisions.draw_number``).
    Raises :class:`errors.InvalidInput` for an empty Statement and
    ``AlgorithmMismatch`` when the configured algorithm cannot be performed
    by the key; the caller's transaction then rolls back.
    """
    if not isinstance(statement, str) or not statement:
        raise errors.InvalidInput("statement must be a non-empty string")
    seq = await queries.draw_number(conn)
    created_at = clock.now_iso()
    payload = orjson.dumps({"seq": seq, "createdAt": created_at, "statement": statement})
    jws = identity.sign(payload, DECISION_TYP)
    return await queries.insert(conn, seq=seq, statement=statement, jws=jws, created_at=created_at)


async def get(store: Store, seq: int) -> Decision:
    """The Decision numbered ``seq``; raises :class:`DecisionNotFound` (not evidence of a withheld one)."""
    decision = await queries.get(store, seq=seq)
    if decision is None:
        raise DecisionNotFound()
    return decision


async def read(store: Store, window: Window) -> list[Decision]:
    """The Decisions of a cursor window, ascending by number (spec: Cursor-window reads)."""
    return await queries.window(store, window=window)
