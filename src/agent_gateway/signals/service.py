"""Signals and Runs: the queue that wakes the agent and the record of what it did.

Spec: "Signal", "Run", "States and transitions", "Events". ``emit`` is what
other areas call (Messages, the Scheduler); the reads back the Agent routes;
``recover`` is what the Signal Worker does at start.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.store import engine
from agent_gateway.store import runs as run_queries
from agent_gateway.store import signals as signal_queries
from agent_gateway.store.runs import Run
from agent_gateway.store.signals import Signal
from agent_gateway.webhooks import outbox

__all__ = [
    "CHANNEL",
    "Run",
    "RunNotFound",
    "Signal",
    "SignalNotFound",
    "emit",
    "emit_many",
    "emit_signals",
    "get_run",
    "get_signal",
    "list_runs",
    "list_signals",
    "recover",
]

CHANNEL = "signals"
STOPPED_SIGNAL_ERROR = (
    "the gateway stopped while this Signal was processing; a failed Signal is never re-run"
)
STOPPED_RUN_ERROR = "the gateway stopped while this Run was running; it is not re-run"
NOT_STARTED_RUN_ERROR = "never started: the gateway stopped while its Signal was processing"


class SignalNotFound(errors.NotFound):
    """No Signal has that id."""


class RunNotFound(errors.NotFound):
    """No Run has that id."""


async def emit(conn: AsyncConnection, kind: str, payload: Any) -> str:
    """Record a pending Signal inside the caller's transaction; return its id.

    The Signal Worker is woken once that transaction commits, so recording
    something and waking the agent for it cannot come apart: a rolled-back
    transaction leaves no Signal and wakes nobody. ``payload`` is any JSON
    value and is stored exactly as written; ``emittedAt`` (now) is the queue
    order, ties broken by insertion.
    """
    [signal_id] = await emit_many(conn, kind, [payload])
    return signal_id


async def emit_many(conn: AsyncConnection, kind: str, payloads: Sequence[Any]) -> list[str]:
    """:func:`emit` a Signal of ``kind`` for each of ``payloads``, in that order; return their ids."""
    return [signal.id for signal in await emit_signals(conn, kind, payloads)]


async def emit_signals(conn: AsyncConnection, kind: str, payloads: Sequence[Any]) -> list[Signal]:
    """:func:`emit_many`, returning the pending Signals as recorded."""
    pending = [(str(uuid.uuid4()), kind, payload, clock.now_iso()) for payload in payloads]
    await signal_queries.insert_many(conn, pending)
    engine.notify(conn, CHANNEL)
    return [Signal(id, kind, payload, at, signal_queries.PENDING, None) for id, kind, payload, at in pending]


async def get_signal(conn: AsyncConnection, signal_id: str) -> Signal:
    """The Signal with ``signal_id``; raises :class:`SignalNotFound`."""
    signal = await signal_queries.get(conn, id=signal_id)
    if signal is None:
        raise SignalNotFound()
    return signal


async def list_signals(
    conn: AsyncConnection, limit: int, kind: str | None = None, *, state: str | None = None
) -> list[Signal]:
    """Up to ``limit`` Signals, newest first, of one ``kind`` and one ``state`` when given."""
    return await signal_queries.newest(conn, limit=limit, kind=kind, state=state)


async def get_run(conn: AsyncConnection, run_id: str) -> Run:
    """The Run with ``run_id``; raises :class:`RunNotFound`."""
    run = await run_queries.get(conn, id=run_id)
    if run is None:
        raise RunNotFound()
    return run


async def list_runs(
    conn: AsyncConnection, limit: int, signal_id: str | None = None, *, state: str | None = None
) -> list[Run]:
    """Up to ``limit`` Runs, newest first by startedAt (not started first), of one Signal and
    one ``state`` when given."""
    return await run_queries.newest(conn, limit=limit, signal_id=signal_id, state=state)


async def recover(conn: AsyncConnection) -> list[str]:
    """Fail what a stopped process left ``processing``; return those Signals' ids.

    Spec: a failed Signal is never re-run, and nothing returns to ``pending``.
    The Run that was running and the Runs not yet started are failed with
    their Signal, each with an error that says why. Pending Signals are left
    alone: the worker runs them.
    """
    now = clock.now_iso()
    ended = await run_queries.fail_unfinished(conn, state=run_queries.RUNNING, error=STOPPED_RUN_ERROR, ended_at=now)
    ended += await run_queries.fail_unfinished(conn, state=run_queries.PENDING, error=NOT_STARTED_RUN_ERROR, ended_at=now)
    failed = await signal_queries.fail_processing(conn, error=STOPPED_SIGNAL_ERROR)
    await outbox.runs_ended(conn, ended)
    await outbox.signals_failed(conn, failed)
    return failed
