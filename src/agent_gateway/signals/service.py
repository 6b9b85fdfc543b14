"""Signals and Runs: the queue that wakes the agent and the record of what it did.

Spec: "Signal", "Run", "States and transitions", "Events". ``emit`` is what
other areas call (Messages, the Scheduler); the reads back the Agent routes;
``recover`` is what the Signal Worker does at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, ids
from agent_gateway.store import engine
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import MESSAGE, OPERATOR, SCHEDULE, Signal
from agent_gateway.webhooks import outbox

__all__ = [
    "CANCELLED_ERROR",
    "CANCEL_CHANNEL",
    "CHANNEL",
    "MESSAGE",
    "OPERATOR",
    "SCHEDULE",
    "NotCancellable",
    "Run",
    "RunNotFound",
    "Signal",
    "SignalNotFound",
    "cancel_run",
    "cancel_signal",
    "count_cancelled",
    "emit",
    "emit_many",
    "emit_signals",
    "get_run",
    "get_signal",
    "list_runs",
    "list_signals",
    "recent_runs",
    "recent_signals",
    "recover",
]

CHANNEL = "signals"
STOPPED_SIGNAL_ERROR = (
    "the gateway stopped while this Signal was processing; a failed Signal is never re-run"
)
STOPPED_RUN_ERROR = "the gateway stopped while this Run was running; it is not re-run"
NOT_STARTED_RUN_ERROR = "never started: the gateway stopped while its Signal was processing"
# An operator's cancel: the error of the Run or pending Signal cancelled, and of the Runs of
# that Run's Signal that had not started. The channel wakes the Signal Worker running the Run.
CANCEL_CHANNEL = "cancels"
CANCELLED_ERROR = "cancelled by the operator"
CANCELLED_SIBLING_ERROR = "never started: another Run of its Signal was cancelled by the operator"


class SignalNotFound(errors.NotFound):
    """No Signal has that id."""


class RunNotFound(errors.NotFound):
    """No Run has that id."""


class NotCancellable(errors.GatewayError):
    """Only a pending or running Run, or a pending Signal, can be cancelled."""


async def emit(conn: AsyncConnection, kind: str, payload: Any, *, origin: str = OPERATOR) -> str:
    """Record a pending Signal inside the caller's transaction; return its id.

    The Signal Worker is woken once that transaction commits, so recording
    something and waking the agent for it cannot come apart: a rolled-back
    transaction leaves no Signal and wakes nobody. ``payload`` is any JSON
    value and is stored exactly as written; ``emittedAt`` (now) is the queue
    order, ties broken by insertion. ``origin`` says what emitted it (``store.queries.signals``):
    the operator's own code unless a Message's or a Schedule's emitter says otherwise; the Run
    ledger records it, so a Signal the operator emits is visible as such whatever its kind.
    """
    [signal_id] = await emit_many(conn, kind, [payload], origin=origin)
    return signal_id


async def emit_many(
    conn: AsyncConnection, kind: str, payloads: Sequence[Any], *, origin: str = OPERATOR, late: bool = False
) -> list[str]:
    """:func:`emit` a Signal of ``kind`` for each of ``payloads``, in that order; return their ids.

    ``late``: the caller reads none of them back in its transaction, so on PostgreSQL its last
    statement may write them (``store.queries.signals.insert_many``)."""
    return [signal.id for signal in await emit_signals(conn, kind, payloads, origin=origin, late=late)]


async def emit_signals(
    conn: AsyncConnection, kind: str, payloads: Sequence[Any], *, origin: str = OPERATOR, late: bool = False
) -> list[Signal]:
    """:func:`emit_many`, returning the pending Signals as recorded."""
    pending = [(ids.new(), kind, payload, clock.now_iso()) for payload in payloads]
    await signal_queries.insert_many(conn, pending, origin=origin, wake=CHANNEL, late=late)
    return [Signal(id, kind, payload, at, signal_queries.PENDING, None, origin) for id, kind, payload, at in pending]


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


async def recent_signals(store: Store, limit: int, kind: str | None = None) -> list[Signal]:
    """:func:`list_signals` without a state, outside any transaction (the Agent server's
    ``GET /signals``, which agents poll)."""
    return await signal_queries.recent(store, limit=limit, kind=kind)


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


async def recent_runs(store: Store, limit: int, signal_id: str | None = None) -> list[Run]:
    """:func:`list_runs` without a state, outside any transaction (the Agent server's
    ``GET /runs``, which agents poll)."""
    return await run_queries.recent(store, limit=limit, signal_id=signal_id)


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



async def cancel_run(conn: AsyncConnection, run_id: str) -> Run:
    """Cancel a ``pending`` or ``running`` Run (an operator's decision, no spec route); return it as cancelled.

    The Run fails with :data:`CANCELLED_ERROR`, and the Runs of its Signal not
    started yet fail too, in the caller's transaction. Once it commits, the
    Signal Worker executing the Run, in whichever process or host leads, is woken
    (``CANCEL_CHANNEL``; it also looks on its own while a Run executes): it stops
    the agent program and ends the Signal ``failed``, never to be run again.
    Spec: Run states are one-way, so a Run that has ended raises
    :class:`NotCancellable` and nothing changes; no such Run raises :class:`RunNotFound`.
    """
    now = clock.now_iso()
    run = await run_queries.cancel(conn, id=run_id, error=CANCELLED_ERROR, ended_at=now)
    if run is None:
        ended = await run_queries.get(conn, id=run_id)
        if ended is None:
            raise RunNotFound(f"no Run has the id {run_id}")
        raise NotCancellable(f"Run {run_id} has already ended ({ended.state}); nothing was changed")
    siblings = await run_queries.fail_unfinished(
        conn, state=run_queries.PENDING, error=CANCELLED_SIBLING_ERROR, ended_at=now, signal_id=run.signal_id
    )
    await outbox.runs_ended(conn, [run.id, *siblings])
    engine.notify(conn, CANCEL_CHANNEL)
    return run


async def cancel_signal(conn: AsyncConnection, signal_id: str) -> Signal:
    """Cancel a ``pending`` Signal: it fails with :data:`CANCELLED_ERROR` and is never run; return it.

    The Signal Worker's claim takes only ``pending`` Signals, so it never sees
    this one. A ``processing`` Signal raises :class:`NotCancellable` naming how to
    cancel its Run instead; one that has ended raises it too; no such Signal
    raises :class:`SignalNotFound`. Nothing changes on any refusal.
    """
    signal = await signal_queries.cancel(conn, id=signal_id, error=CANCELLED_ERROR)
    if signal is not None:
        await outbox.signals_failed(conn, [signal.id])
        return signal
    found = await signal_queries.get(conn, id=signal_id)
    if found is None:
        raise SignalNotFound(f"no Signal has the id {signal_id}")
    if found.state == signal_queries.PROCESSING:
        raise NotCancellable(
            f"Signal {signal_id} is processing, not pending: cancel its running Run instead "
            f"(agent-gateway runs list --signal {signal_id} --state running; agent-gateway runs cancel RUN_ID)"
        )
    raise NotCancellable(f"Signal {signal_id} has already ended ({found.state}); nothing was changed")


async def count_cancelled(conn: AsyncConnection) -> dict[str, int]:
    """How many Runs, and Signals cancelled while pending, the operator has cancelled (as far as records remain)."""
    return {
        "run": await run_queries.count_failed_with(conn, error=CANCELLED_ERROR),
        "signal": await signal_queries.count_failed_with(conn, error=CANCELLED_ERROR),
    }
