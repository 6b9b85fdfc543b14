"""What keeps a loop running: the Signal Worker, the Scheduler's timer, the webhook deliverer, the pruner.

Each loop is handed to :func:`supervise` by its owner (``leadership.lead`` for
the Signal Worker, :class:`woken.WokenLoop` for the timer and the deliverer,
the pruner itself), which is the one place where a loop that raises is dealt
with: it is logged (with its traceback, once for a run of the same failure),
counted in ``agent_gateway_loop_restarts_total{loop=...}``, and started again
after a backoff that doubles from :data:`FIRST_BACKOFF_S` up to
:data:`MAX_BACKOFF_S`. No loop catches its own failures to carry on: a
database outage, a bug and a fault all end the pass and restart the loop, so
nothing ends unseen and a loop that keeps failing is visible on ``/metrics``.

The counter is declared here rather than in ``ops.metrics`` because the store
floor may not import the areas; it is exposed like every other metric (the
default registry, or the multi-process directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 1.0
# A loop that keeps failing is tried again at least this often: long enough not to hammer a
# database that is down, short enough that work resumes soon after it is back.
MAX_BACKOFF_S = 30.0

restarts = Counter(
    "agent_gateway_loop_restarts",
    "Times a loop (signal worker, scheduler timer, webhook deliverer, pruner) raised and was started again.",
    ("loop",),
)


async def supervise(name: str, work: Callable[[], Awaitable[None]], *, stop: asyncio.Event | None = None) -> None:
    """Run ``work`` until it returns, or until ``stop`` is set; each time it raises, log, count,
    wait (backing off) and run it again.

    A cancel is never caught: it ends the loop as it ends any task. ``stop``, when given, cuts
    a backoff short, so that a loop asked to stop while it waits to restart returns at once.
    """
    backoff = FIRST_BACKOFF_S
    previous: tuple[type[BaseException], str] | None = None
    repeats = 0
    while stop is None or not stop.is_set():
        started = time.monotonic()
        try:
            await work()
            return
        except Exception as exc:
            if stop is not None and stop.is_set():
                # Asked to stop meanwhile: the failure still shows, but nothing restarts.
                logger.error("%s failed while stopping", name, exc_info=exc, extra={"action": "loop_failed", "loop": name})
                return
            # A loop that ran a while before failing starts again soon: the backoff is for crash loops.
            if time.monotonic() - started >= MAX_BACKOFF_S:
                backoff = FIRST_BACKOFF_S
            restarts.labels(name).inc()
            failure = (type(exc), str(exc))
            if failure == previous:
                # The same failure again (a database that stays down): one line, the traceback was logged.
                repeats += 1
                logger.error(
                    "%s failed again (%s, as before: %d times in a row); restarting in %ss",
                    name, type(exc).__name__, repeats + 1, backoff, extra={"action": "loop_failed", "loop": name},
                )
            else:
                previous, repeats = failure, 0
                logger.error(
                    "%s failed; restarting in %ss", name, backoff, exc_info=exc,
                    extra={"action": "loop_failed", "loop": name},
                )
        await _wait(stop, backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


async def _wait(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
