"""Retention: removing Signals that ended long ago, with their Runs (``agent-gateway prune``).

Only ended Signals (``done``, ``failed``) and their Runs are removed; pending
and processing Signals, Messages, Decisions, Users, Tokens and Schedules are
never touched (the spec keeps them). Removal goes in small batches, one
transaction each, so no lock is held long and serving goes on meanwhile.
With ``retention.signals_max_age`` set, the Scheduler role's
:class:`Pruner` does this on its own once an hour.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import timedelta

from agent_gateway import clock
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import retention as queries

logger = logging.getLogger(__name__)

# Signals removed per transaction: a few milliseconds of locks, whatever the backlog.
PRUNE_BATCH = 500
PRUNE_INTERVAL_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Pruned:
    """What a prune removed (or, dry, would remove)."""

    before: str
    signals: int
    runs: int
    dry_run: bool

    def to_json(self) -> dict[str, object]:
        return {"before": self.before, "signals": self.signals, "runs": self.runs, "dryRun": self.dry_run}


async def prune(store: Store, age: timedelta, *, dry_run: bool = False, batch: int = PRUNE_BATCH) -> Pruned:
    """Remove the Signals that ended more than ``age`` ago, with their Runs; ``dry_run`` only counts."""
    cutoff = clock.format_instant(clock.now() - age)
    if dry_run:
        async with store.read() as conn:
            signal_count, run_count = await queries.count_ended(conn, cutoff=cutoff)
        return Pruned(cutoff, signal_count, run_count, True)
    signal_total = run_total = 0
    while True:
        async with store.transaction() as conn:
            signal_count, run_count = await queries.delete_ended(conn, cutoff=cutoff, limit=batch)
        signal_total += signal_count
        run_total += run_count
        if signal_count < batch:
            return Pruned(cutoff, signal_total, run_total, False)


class Pruner:
    """The Scheduler role's hourly prune (``retention.signals_max_age``); first at start."""

    def __init__(self, store: Store, max_age: timedelta) -> None:
        self.store = store
        self.max_age = max_age
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="signal pruner")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pruned = await prune(self.store, self.max_age)
            except Exception:
                logger.exception(
                    "pruning ended Signals failed; trying again in an hour", extra={"action": "prune_failed"}
                )
            else:
                if pruned.signals:
                    logger.info(
                        "pruned %d ended Signals and %d Runs (ended before %s)",
                        pruned.signals,
                        pruned.runs,
                        pruned.before,
                        extra={"action": "pruned"},
                    )
            try:
                await asyncio.wait_for(self._stop.wait(), PRUNE_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
