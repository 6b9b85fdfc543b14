"""Retention: removing what ended long ago (``agent-gateway prune``): Signals with their Runs, and
the closed rows of every outbox (the webhook deliveries, the chat channels' deliveries).

Only ended Signals (``done``, ``failed``) and their Runs are removed, and of an
outbox only its closed rows (deliveries ``delivered`` or ``dead``); pending
and processing Signals, open deliveries, Messages, Decisions, Users, Tokens
and Schedules are never touched (the spec keeps them). Removal goes in small
batches, one transaction each, so no lock is held long and serving goes on
meanwhile. With ``retention.signals_max_age`` or
``retention.deliveries_max_age`` set, the Scheduler role's :class:`Pruner`
does this on its own once an hour.

Another outbox is pruned the same way by adding its
``store.queries.retention.Outbox`` to :data:`OUTBOXES`: ``retention.deliveries_max_age``
is the age of each (``gateway.py``), and nothing here is specific to one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock
from agent_gateway.store import supervisor
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.store.queries import retention as queries
from agent_gateway.store.queries import webhooks as webhook_queries

logger = logging.getLogger(__name__)

# Rows removed per transaction: a few milliseconds of locks, whatever the backlog.
PRUNE_BATCH = 500
PRUNE_INTERVAL_S = 3600.0
# Every outbox, by the name prune reports its count under.
OUTBOXES: Mapping[str, queries.Outbox] = {
    "deliveries": webhook_queries.OUTBOX,
    "channelDeliveries": channel_queries.OUTBOX,
}


@dataclasses.dataclass(frozen=True)
class Pruned:
    """What a prune removed (or, dry, would remove): Signals, Runs and each outbox's rows."""

    before: str
    signals: int
    runs: int
    dry_run: bool
    outboxes: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"before": self.before, "signals": self.signals, "runs": self.runs, **self.outboxes, "dryRun": self.dry_run}


def _cutoff(age: timedelta) -> str:
    return clock.format_instant(clock.now() - age)


async def prune(store: Store, age: timedelta, *, dry_run: bool = False, batch: int = PRUNE_BATCH) -> Pruned:
    """Remove the Signals that ended more than ``age`` ago, with their Runs, and every outbox's
    rows closed as long ago; ``dry_run`` only counts."""
    cutoff = _cutoff(age)
    signals, runs = await _signals(store, cutoff, dry_run=dry_run, batch=batch)
    outboxes = {
        name: await _outbox(store, outbox, cutoff, dry_run=dry_run, batch=batch) for name, outbox in OUTBOXES.items()
    }
    return Pruned(cutoff, signals, runs, dry_run, outboxes)


async def prune_signals(store: Store, age: timedelta, *, batch: int = PRUNE_BATCH) -> Pruned:
    """Remove the Signals that ended more than ``age`` ago, with their Runs (no outbox)."""
    cutoff = _cutoff(age)
    signals, runs = await _signals(store, cutoff, dry_run=False, batch=batch)
    return Pruned(cutoff, signals, runs, False)


async def prune_outbox(store: Store, name: str, age: timedelta, *, batch: int = PRUNE_BATCH) -> int:
    """Remove the rows of the outbox ``name`` (in :data:`OUTBOXES`) closed more than ``age`` ago."""
    return await _outbox(store, OUTBOXES[name], _cutoff(age), dry_run=False, batch=batch)


async def _signals(store: Store, cutoff: str, *, dry_run: bool, batch: int) -> tuple[int, int]:
    if dry_run:
        async with store.read() as conn:
            return await queries.count_ended(conn, cutoff=cutoff)

    async def delete(conn: AsyncConnection) -> tuple[int, ...]:
        return await queries.delete_ended(conn, cutoff=cutoff, limit=batch)

    signals, runs = await _in_batches(store, delete, batch)
    return signals, runs


async def _outbox(store: Store, outbox: queries.Outbox, cutoff: str, *, dry_run: bool, batch: int) -> int:
    if dry_run:
        async with store.read() as conn:
            return await queries.count_closed(conn, outbox, cutoff=cutoff)

    async def delete(conn: AsyncConnection) -> tuple[int, ...]:
        return (await queries.delete_closed(conn, outbox, cutoff=cutoff, limit=batch),)

    [count] = await _in_batches(store, delete, batch)
    return count


async def _in_batches(
    store: Store, delete: Callable[[AsyncConnection], Awaitable[tuple[int, ...]]], batch: int
) -> tuple[int, ...]:
    """Run ``delete`` (which removes up to ``batch`` rows, counted first in what it returns) one
    transaction at a time until a batch comes back short; return the sums of its counts."""
    totals: tuple[int, ...] = ()
    while True:
        async with store.transaction() as conn:
            counts = await delete(conn)
        totals = tuple(a + b for a, b in zip(totals or (0,) * len(counts), counts, strict=True))
        if counts[0] < batch:
            return totals


class Pruner:
    """The Scheduler role's hourly prune (``retention.signals_max_age``, ``retention.deliveries_max_age``);
    first at start. It runs under ``store.supervisor``: a prune that fails is logged, counted and tried
    again after a backoff, not an hour later."""

    name = "pruner"

    def __init__(
        self, store: Store, signals_max_age: timedelta | None, outbox_ages: Mapping[str, timedelta] | None = None
    ) -> None:
        self.store = store
        self.max_age = signals_max_age
        self.outbox_ages = dict(outbox_ages or {})
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(supervisor.supervise(self.name, self._run, stop=self._stop), name=self.name)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.prune_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PRUNE_INTERVAL_S):
                    await self._stop.wait()

    async def prune_once(self) -> None:
        """One pass: the Signals, then each outbox with an age; logs what went."""
        if self.max_age is not None:
            pruned = await prune_signals(self.store, self.max_age)
            if pruned.signals:
                logger.info(
                    "pruned %d ended Signals and %d Runs (ended before %s)", pruned.signals, pruned.runs,
                    pruned.before, extra={"action": "pruned"},
                )
        for name, age in self.outbox_ages.items():
            count = await prune_outbox(self.store, name, age)
            if count:
                logger.info("pruned %d closed %s (older than %s)", count, name, age, extra={"action": "pruned"})
