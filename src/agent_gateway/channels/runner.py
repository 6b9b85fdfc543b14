"""Runs one channel in the process that leads it: its network's read and its sender.

Exactly one process of a deployment reads each channel at a time: on
PostgreSQL the one holding the channel's advisory lock (``store.leadership``,
the Signal Worker's pattern, each channel its own lock), with hot standbys in
the other processes of the same role; on SQLite the one serving process. The
leader also runs the channel's sender. Which processes stand for it is the
``worker`` role's (``agent-gateway serve --role worker`` or ``all``).
"""

from __future__ import annotations

import asyncio
import logging

from agent_gateway.channels.network import Network
from agent_gateway.channels.sender import Sender
from agent_gateway.store import leadership
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)


class Runner:
    """One channel's leadership, read and sender; :meth:`start` and :meth:`stop` are the gateway's."""

    def __init__(self, store: Store, network: Network) -> None:
        self.store = store
        self.network = network
        self.leading = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(
            leadership.lead(self.store, f"channel {self.network.name}", self._lead), name=f"{self.network.name} channel"
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def status(self) -> str:
        """For /readyz: ``ok``, standing by, or why the leader cannot reach its server."""
        if not self.leading:
            return "ok (standing by)"
        if self.network.reachable is False:
            return f"cannot reach the {self.network.name} server: {self.network.problem or 'unknown'}"
        return "ok"

    async def _lead(self) -> None:
        sender = Sender(self.store, self.network)
        self.leading = True
        sender.start()
        try:
            await self.network.read()
        finally:
            self.leading = False
            await sender.stop()
            await self.network.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
