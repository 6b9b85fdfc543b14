"""The Scheduler's timer: fires due Schedules, then sleeps until the next one is due.

It sleeps until the earliest ``nextFireAt`` or the maximum sleep, whichever
is sooner, and a committed Schedule write or delete wakes it at once
(``engine.notify`` on :data:`service.CHANNEL`). The maximum sleep is the
correctness fallback for writes it is not told about (another process).
Each wake drains: it fires in batches until nothing is due.
"""

from __future__ import annotations

import logging
from datetime import datetime

from agent_gateway import clock
from agent_gateway.ops import metrics
from agent_gateway.scheduler import service
from agent_gateway.store import woken
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

# Schedules fired per transaction: large enough that a thousand due at once
# cost a few commits, small enough to hold locks briefly.
FIRE_BATCH = 100
# A due Schedule this process could not claim is locked by another firer (or
# writer); look again shortly rather than spin.
LOCKED_RETRY_S = 0.01


class Timer(woken.WokenLoop):
    """One timer loop; :meth:`start` and :meth:`stop` are called by the gateway."""

    name = "scheduler timer"

    def __init__(self, store: Store, *, max_sleep_ms: int) -> None:
        super().__init__(store, service.CHANNEL)
        self.max_sleep_s = max_sleep_ms / 1000

    async def _run(self) -> None:
        expect_due = False
        while not self._stopping:
            # A failure (the database went away) raises: the supervisor restarts the loop (store.woken).
            delay = await self.step(expect_due=expect_due)
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
