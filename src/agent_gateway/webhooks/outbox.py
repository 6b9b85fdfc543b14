"""The outbox: a webhook delivery is written in the transaction of the event it reports.

So a committed event is always delivered (at least once, by the deliverer)
and a rolled-back one never is. A delivery is one row per subscribed endpoint
(``[[webhooks]]``), its body the Standard Webhooks shape ``{"type": <event>,
"timestamp": <the event's instant>, "data": <the spec's record>}``, fixed at
the event, so every attempt sends the same bytes. A Decision never changes and
is never removed, so a ``decision.published`` delivery holds its number, not a
copy, and is written by the Decisions' own insert
(:func:`decision_deliveries`); :func:`composed` makes the same bytes from it at
each attempt. Where no endpoint subscribes to an event, its writers pay one
dictionary lookup and write nothing: the records of :func:`add` are not even
built. The operator's view of the outbox and its retry (``agent-gateway
webhooks``) go through here too (:func:`newest`, :func:`retry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, ids, jsontext
from agent_gateway.store import engine
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import decisions as decision_queries
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries import webhooks as queries
from agent_gateway.store.queries.decisions import Decision

# The deliverers' wake-up, sent once a transaction that wrote deliveries commits.
CHANNEL = "webhooks"
RUN_ENDED = "run.ended"
SIGNAL_FAILED = "signal.failed"
MESSAGE_INBOUND = "message.inbound"
MESSAGE_OUTBOUND = "message.outbound"
DECISION_PUBLISHED = "decision.published"
SCHEDULE_FIRED = "schedule.fired"


def subscribed(conn: AsyncConnection, event: str) -> bool:
    """Whether any endpoint subscribes to ``event`` (in the Store of ``conn``'s transaction)."""
    return bool(engine.webhook_urls(conn, event))


def body(event: str, at: str, record: Any) -> str:
    """The body of a delivery of ``event`` at instant ``at`` reporting ``record``."""
    return jsontext.dumps({"type": event, "timestamp": at, "data": record}).decode()


async def add(conn: AsyncConnection, event: str, records: Iterable[tuple[str, Any]]) -> None:
    """Record a delivery of each ``(instant, record)`` to every endpoint subscribed to ``event``,
    in the caller's transaction; ``records`` is iterated only when one is (pass a generator)."""
    urls = engine.webhook_urls(conn, event)
    rows = _rows(event, urls, ((at, body(event, at, record), None) for at, record in records)) if urls else []
    if rows:
        await queries.insert(conn, rows, channel=CHANNEL)


def decision_deliveries(conn: AsyncConnection, published: Sequence[Decision]) -> list[tuple[Any, ...]]:
    """The ``decision.published`` deliveries of Decisions this transaction publishes, each
    holding the Decision's number (see :func:`composed`), for ``store.queries.decisions.insert`` to
    write with them (on PostgreSQL, in the same statement); none when no endpoint subscribes."""
    urls = engine.webhook_urls(conn, DECISION_PUBLISHED)
    return _rows(DECISION_PUBLISHED, urls, ((d.created_at, None, d.seq) for d in published)) if urls else []


def _rows(
    event: str, urls: Sequence[str], deliveries: Iterable[tuple[str, str | None, int | None]]
) -> list[tuple[Any, ...]]:
    """A pending delivery to each of ``urls`` of each ``(instant, body, decision_seq)``, in the
    order of ``store.queries.webhooks.NEW_ROWS``' columns."""
    now = clock.now_iso()
    # Ids in time order (ids.new): on SQLite a third of what a row costs with random ones.
    return [(ids.new(), url, event, text, seq, at, now, at) for at, text, seq in deliveries for url in urls]


async def composed(conn: AsyncConnection, claimed: Sequence[queries.Claimed]) -> list[queries.Claimed]:
    """``claimed``, each delivery that holds a Decision's number given the body made from that
    Decision: the bytes a copy taken at the event would be. One whose Decision is not found
    (none is ever removed) keeps no body, and its attempt fails saying so."""
    seqs = sorted({c.decision_seq for c in claimed if c.body is None and c.decision_seq is not None})
    if not seqs:
        return list(claimed)
    found = {d.seq: d for d in await decision_queries.get_many(conn, seqs=seqs)}
    return [
        dataclasses.replace(c, body=body(c.event, found[c.decision_seq].created_at, found[c.decision_seq].to_json()))
        if c.body is None and c.decision_seq in found else c
        for c in claimed
    ]


async def runs_ended(conn: AsyncConnection, run_ids: Sequence[str]) -> None:
    """``run.ended`` for Runs this transaction has just ended, as they are stored now."""
    if run_ids and subscribed(conn, RUN_ENDED):
        ended = await run_queries.get_many(conn, ids=run_ids)
        await add(conn, RUN_ENDED, ((run.ended_at, run.to_json()) for run in ended))


async def signals_failed(conn: AsyncConnection, signal_ids: Sequence[str]) -> None:
    """``signal.failed`` for Signals this transaction has just failed, as they are stored now.

    A Signal carries no instant of its end, so the event's is now.
    """
    if signal_ids and subscribed(conn, SIGNAL_FAILED):
        failed = await signal_queries.get_many(conn, ids=signal_ids)
        now = clock.now_iso()
        await add(conn, SIGNAL_FAILED, ((now, signal.to_json()) for signal in failed))


async def newest(store: Store, *, limit: int, state: str | None = None) -> list[queries.Delivery]:
    """The newest ``limit`` deliveries, newest event first; only those in ``state`` when given."""
    async with store.read() as conn:
        return await queries.newest(conn, limit=limit, state=state)


class NotRetriable(errors.GatewayError):
    """Only a failed or dead delivery can be retried."""


async def retry(conn: AsyncConnection, id: str) -> queries.Delivery:
    """Make the failed or dead delivery ``id`` due now, with a fresh retry period; the
    deliverers are woken once the caller's transaction commits."""
    retried = await queries.retry(conn, id=id, now=clock.now_iso())
    if retried is None:
        found = await queries.get(conn, id=id)
        if found is None:
            raise errors.NotFound(f"no webhook delivery has the id {id}")
        raise NotRetriable(f"delivery {id} is {found.state}; only a failed or dead delivery can be retried")
    engine.notify(conn, CHANNEL)
    return retried
