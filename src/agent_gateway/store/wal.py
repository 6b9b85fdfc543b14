"""SQLite's WAL checkpoints, on a thread of their own instead of in a commit.

By default SQLite checkpoints inside the commit that takes the WAL past 1,000
pages: that commit copies the pages into the database file and waits for the
disk twice (the WAL, then the database), and since the gateway's SQLite
connections run on the event loop (``store.sqlite``), every request of the
process waits with it. Here the connections that write do not checkpoint
(``wal_autocheckpoint=0``); a commit only wakes the :class:`Checkpointer`,
which runs SQLite's own passive checkpoint (the kind the automatic one is:
it never blocks readers or writers) on a connection and thread of its own, at
most every ``GAP_S``, so the WAL holds at most about that much time of writes.

Durability is unchanged: a commit is durable against a crash of the process
once it is in the WAL (``synchronous=NORMAL``), whoever checkpoints it later,
and a checkpoint never removes a frame it has not copied.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sqlite3

logger = logging.getLogger(__name__)

# The longest the WAL collects commits before they are copied into the database file.
GAP_S = 1.0
PRAGMA = "wal_autocheckpoint=0"


class Checkpointer:
    """Checkpoints one database file's WAL after commits, off the event loop; usable again after :meth:`close`."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._connection: sqlite3.Connection | None = None  # used on the checkpoint thread only
        self._due = asyncio.Event()
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    def committed(self) -> None:
        """A commit on the event loop's thread has grown the WAL: checkpoint soon."""
        if self._task is None:
            self._due = asyncio.Event()  # of this loop (a Store may be used again in another)
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite checkpoint")
            self._task = asyncio.get_running_loop().create_task(self._run(self._thread), name="sqlite checkpoint")
        self._due.set()

    async def _run(self, thread: concurrent.futures.ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._due.wait()
            self._due.clear()
            try:
                await loop.run_in_executor(thread, self._checkpoint)
            except sqlite3.Error as exc:  # the next commit asks again
                logger.warning("WAL checkpoint failed (%s)", exc, extra={"action": "wal_checkpoint_failed"})
            await asyncio.sleep(GAP_S)

    def _checkpoint(self) -> None:
        if self._connection is None:
            self._connection = sqlite3.connect(self.database, isolation_level=None, check_same_thread=False)
        # PASSIVE copies what no reader still needs and waits for no lock: busy is no error.
        self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    async def close(self) -> None:
        task, thread = self._task, self._thread
        self._task = self._thread = None
        if task is None or thread is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Waits, off the loop, for a checkpoint under way to end.
        await asyncio.to_thread(thread.shutdown)
        if self._connection is not None:
            self._connection.close()
            self._connection = None
