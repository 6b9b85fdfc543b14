"""Group commit: the writes of concurrent requests, many to a transaction.

A write that every request makes alone pays the whole fixed cost of a
transaction: a pool checkout, BEGIN, COMMIT and its flush to disk, and, for
the logs, a lock every writer of the log queues on until that flush is done.
A :class:`Batcher` lets a writer hand its item over and wait: the first item
starts a transaction at once, and the items that arrive while it runs go
together into the next one. With no load a batch is one item and waits for
nothing; under load the fixed cost is shared by the whole batch.

Each caller still gets its own outcome. ``write`` answers one result per item,
an exception standing for an item refused without harm to the transaction
(a User nobody holds, say). When the transaction itself fails, its items are
written again one per transaction, so that an error belongs to the one item
that caused it and the others commit as they would have alone; except when
the database cannot be reached, which is every item's answer at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.engine import Store
from agent_gateway.store.unavailable import database_unavailable

Item = TypeVar("Item")
Result = TypeVar("Result")
# Items per transaction: a cap keeps a batch's locks short and its commit's wait small.
BATCH_LIMIT = 64

logger = logging.getLogger(__name__)

Write = Callable[[AsyncConnection, Sequence[Item]], Awaitable[Sequence["Result | Exception"]]]
Entry = tuple[Item, "asyncio.Future[Result]"]
Idle = Callable[[Any], Awaitable[None]]


class _Queue(Generic[Item, Result]):
    """The items waiting for the next batch, each with its caller's future."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._waiting: list[Entry[Item, Result]] = []

    def _queue(self, item: Item) -> asyncio.Future[Result]:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        return future

    async def _drain(self, handle: Callable[[list[Entry[Item, Result]]], Awaitable[None]]) -> None:
        """Hand the waiting items to ``handle`` a batch at a time until none waits (those whose
        callers were cancelled meanwhile left out)."""
        batch: list[Entry[Item, Result]] = []
        try:
            while self._waiting:
                batch = [entry for entry in self._waiting[: self._limit] if not entry[1].done()]
                del self._waiting[: self._limit]
                if batch:
                    await handle(batch)
        except asyncio.CancelledError:  # stopped with the loop: nobody may wait forever
            for _, future in batch + self._waiting:
                future.cancel()
            self._waiting.clear()
            raise


class Batcher(_Queue[Item, Result]):
    """Runs ``write`` on batches of submitted items, one transaction per batch (or none, ``alone``), one batch at a time."""

    def __init__(
        self, store: Store, write: Write[Item, Result], *, limit: int = BATCH_LIMIT, alone: bool = False,
        idle: Idle | None = None, linger: float = 0.0,
    ) -> None:
        """``alone``: ``write``'s statements need no transaction around them, so each commits
        by itself (:meth:`Store.alone_writer`: one batch at a time, on PostgreSQL on a connection
        of its own), without the transaction's fixed cost.

        ``idle``: run on the writer's connection once no item has come for ``linger`` seconds
        after a batch, for a writer that holds something from one batch to the next (a lock)."""
        super().__init__(limit)
        self._store = store
        self._write = write
        self._connection = store.alone_writer() if alone else store.transaction
        self._idle = idle
        self._linger = linger
        self._arrived = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """Write ``item`` in the next batch and return its result, or raise its error.

        A caller cancelled before its batch begins withdraws the item; one
        cancelled later leaves it to commit, as a request whose client left
        after the commit.
        """
        future = self._queue(item)
        self._arrived.set()
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_all())
        return await future

    async def _write_all(self) -> None:
        try:
            while self._waiting:
                await self._drain(self._commit)
                if self._idle is not None:
                    await self._lingered()
        finally:
            self._writer = None

    async def _lingered(self) -> None:
        """Wait ``linger`` seconds for an item; when none comes, run ``idle``."""
        assert self._idle is not None
        self._arrived.clear()
        try:
            async with asyncio.timeout(self._linger):
                await self._arrived.wait()
            return
        except TimeoutError:
            pass
        try:
            async with self._connection() as conn:
                await self._idle(conn)
        except Exception as exc:  # the items that came meanwhile are still written
            logger.debug("a writer's idle step failed (%s)", type(exc).__name__)

    async def _commit(self, batch: list[Entry[Item, Result]]) -> None:
        try:
            async with self._connection() as conn:
                results = await self._write(conn, [item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or database_unavailable(exc):  # no item's fault: each would wait for it again
                for _, future in batch:
                    _settle(future, exc)
                return
            logger.debug("a batch of %d failed (%s); writing its items one by one", len(batch), type(exc).__name__)
            for entry in batch:
                await self._commit([entry])
            return
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result)


Read = Callable[[Sequence[Item]], Awaitable[Sequence[Result]]]


class Lookups(_Queue[Item, Result]):
    """Concurrent reads of one kind, many to a statement: a :class:`Batcher` for reads, where each
    statement is a round trip (PostgreSQL). A read that finds none under way runs at once, alone,
    in its caller's task (no task to start: with no load nothing costs more); the reads that arrive
    meanwhile wait for it and then go together, ``read`` once for them all. Each statement starts
    after every read in it was asked, so it sees all that committed before (a Token revoked then is
    refused). ``read``'s error is the answer of each read in its batch."""

    def __init__(self, read: Read[Item, Result], *, limit: int = BATCH_LIMIT) -> None:
        super().__init__(limit)
        self._read = read
        self._busy = False
        self._reader: asyncio.Task[None] | None = None

    async def __call__(self, item: Item) -> Result:
        if self._busy:
            return await self._queue(item)
        self._busy = True
        try:
            [result] = await self._read([item])
        finally:
            if self._waiting:  # they waited for this read: theirs goes next
                self._reader = asyncio.get_running_loop().create_task(self._read_waiting())
            else:
                self._busy = False
        return result

    async def _read_waiting(self) -> None:
        try:
            await self._drain(self._read_batch)
        finally:
            self._busy = False
            self._reader = None

    async def _read_batch(self, batch: list[Entry[Item, Result]]) -> None:
        try:
            results: Sequence[Result | Exception] = await self._read([item for item, _ in batch])
        except Exception as exc:
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result)


def _settle(future: asyncio.Future[Result], outcome: Result | Exception) -> None:
    if future.done():  # its caller was cancelled
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
