"""Vacuuming a queue table on PostgreSQL after so many of its rows have moved on.

A claim updates its row (a Signal ``pending`` to ``processing`` to ``done``, a
webhook delivery ``pending`` to leased to ``delivered``), and each update of an
indexed column leaves the row's earlier version behind, with its entry in the
queue's index, until VACUUM removes both. The oldest of those entries lie exactly
where the next claim's index scan starts: after a burst of 50,000 Signals the
claim of the next one stepped over 777 index pages (0.6 ms, 3.6 ms when not
cached) to find that nothing was pending. Autovacuum removes them in time, with
its default thresholds once a fifth of the table has changed, which on a long
log is a great many Signals; on a server where it is off, never. So the process
that claims vacuums the table itself every :data:`EVERY` claims, in a task of
its own beside the claims (VACUUM takes no lock that a claim or an insert waits
for). SQLite updates rows in place and needs none of this.
"""

from __future__ import annotations

import asyncio
import logging

from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

# Claims between two vacuums: their dead index entries cost a claim about 0.1 ms to step over.
EVERY = 5000


class Vacuum:
    """Counts the claims on ``table`` and vacuums it after each :data:`EVERY` (PostgreSQL only)."""

    def __init__(self, store: Store, table: str) -> None:
        self._store = store
        self._table = table
        self._claimed = 0
        self._task: asyncio.Task[None] | None = None

    def claimed(self, count: int = 1) -> None:
        """Note ``count`` claims; start a vacuum when :data:`EVERY` have gone by since the last."""
        if self._store.dialect != "postgresql":
            return
        self._claimed += count
        if self._claimed >= EVERY and (self._task is None or self._task.done()):
            self._claimed = 0
            self._task = asyncio.create_task(self._vacuum(), name=f"vacuum {self._table}")

    async def _vacuum(self) -> None:
        try:
            await self._store.vacuum(self._table)
        except Exception as exc:  # the next one may succeed; the claims go on either way
            logger.warning(
                "VACUUM of %s failed: %s", self._table, type(exc).__name__, extra={"action": "vacuum_error"}
            )

    async def close(self) -> None:
        """Stop a vacuum in progress (VACUUM may be cancelled at any point) and wait for it."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
