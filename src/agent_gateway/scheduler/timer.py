"""The Scheduler's timer: fires due Schedules, then sleeps until the next one is due.

It sleeps until the earliest ``nextFireAt`` or the maximum sleep, whichever
is sooner, and a committed Schedule write or delete wakes it at once
(``engine.notify`` on :data:`service.CHANNEL`). The maximum sleep is the
correctness fallback for writes it is not told about (another process).
Each wake drains: it fires in batches until nothing is due.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from agent_gateway import clock
from agent_gateway.ops import metrics
from agent_gateway.scheduler import service
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

# Schedules fired per transaction: large enough that a thousand due at once
# cost a few commits, small enough to hold locks briefly.
FIRE_BATCH = 100
# After a failure (the database is unreachable, say), try again this soon.
RETRY_AFTER_ERROR_S = 1.0
# A due Schedule this process could not claim is locked by another firer (or
# writer); look again shortly rather than spin.
LOCKED_RETRY_S = 0.01
STOP_TIMEOUT_S = 10.0


class Timer:
    """One timer loop; :meth:`start` and :meth:`stop` are called by the gateway."""

    def __init__(self, store: Store, *, max_sleep_ms: int) -> None:
        self.store = store
        self.max_sleep_s = max_sleep_ms / 1000
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # Subscribed before the first drain, so a write that commits while the
        # loop is busy still cuts the following sleep short.
        self._wake = store.subscribe(service.CHANNEL)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scheduler timer")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Let a fire in progress commit, then end the loop."""
        self._stopping = True
        self._wake.wake()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                logger.warning("scheduler timer did not stop in %ss; cancelled", STOP_TIMEOUT_S)
        self.store.unsubscribe(service.CHANNEL, self._wake)

    async def _run(self) -> None:
        expect_due = False
        while not self._stopping:
            try:
                delay = await self.step(expect_due=expect_due)
            except Exception:
                logger.exception("scheduler timer: firing failed; retrying", extra={"action": "fire_failed"})
                delay = RETRY_AFTER_ERROR_S
            woken = await self._wake.wait(delay)
            # Slept until a fire was due and no write changed that: fire without looking first.
            expect_due = not woken and delay < self.max_sleep_s

    async def step(self, *, expect_due: bool = False) -> float:
        """Fire everything due now; return how many seconds to sleep before the next look.

        With ``expect_due`` it opens the firing transaction straight away
        instead of first reading when the next fire is (one round trip less
        between the due instant and the fire).
        """
        earliest: datetime | None
        if expect_due:
            earliest = clock.now()
        else:
            async with self.store.read() as conn:
                earliest = await service.earliest_fire(conn)
        while earliest is not None and earliest <= clock.now():
            async with self.store.transaction() as conn:
                fired = await service.fire_due(conn, limit=FIRE_BATCH)
                # Read in the same transaction: one round trip fewer per fire.
                earliest = await service.earliest_fire(conn)
            # Observed once committed: a batch that rolls back fires again later, and counts then.
            for fire in fired:
                metrics.schedule_fire_lateness.observe(fire.lateness_s)
            logger.debug("fired %d Schedules", len(fired), extra={"action": "fired"})
            if not fired and earliest is not None and earliest <= clock.now():
                return LOCKED_RETRY_S
        if earliest is None:
            return self.max_sleep_s
        return min((earliest - clock.now()).total_seconds(), self.max_sleep_s)
