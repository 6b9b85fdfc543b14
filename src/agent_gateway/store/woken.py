"""A long-running loop woken through the store's notifications: the Scheduler's timer, the webhook deliverer.

Each subscribes to its channel before its first pass, so that a write committed
while the loop is busy still cuts its next sleep short; :meth:`WokenLoop.stop`
lets the pass in progress commit (up to a while), then ends the loop. The loop
runs under :func:`supervisor.supervise`: one that raises (the database went
away, a bug) is logged, counted and started again, never left dead.
"""

from __future__ import annotations

import abc
import asyncio
import logging

from agent_gateway.store import supervisor
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class WokenLoop(abc.ABC):
    """A loop task; :meth:`start` and :meth:`stop` are called by the gateway, :meth:`_run` is the loop."""

    name = "loop"

    def __init__(self, store: Store, channel: str) -> None:
        self.store = store
        self._channel = channel
        self._stopping = False
        self._stopped = asyncio.Event()  # cuts a restart's backoff short
        self._task: asyncio.Task[None] | None = None
        self._wake = store.subscribe(channel)

    def start(self) -> None:
        self._task = asyncio.create_task(supervisor.supervise(self.name, self._run, stop=self._stopped), name=self.name)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Let the pass in progress commit, then end the loop (cancelled after ``STOP_TIMEOUT_S``)."""
        self._stopping = True
        self._stopped.set()
        self._wake.wake()
        if self._task is not None:
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self._task
            except TimeoutError:
                logger.warning("%s did not stop in %ss; cancelled", self.name, STOP_TIMEOUT_S)
        self.store.unsubscribe(self._channel, self._wake)

    @abc.abstractmethod
    async def _run(self) -> None:
        """The loop itself, until ``_stopping``; it lets whatever it cannot do raise (see the module's docstring)."""
