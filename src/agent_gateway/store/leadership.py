"""One active holder of a role across all gateway processes (the Signal Worker).

On PostgreSQL the leader holds a session advisory lock on a dedicated
connection. Every other process is a hot standby that retries the lock every
``retry_s``; when the leader's connection dies (process killed, host lost) the
server releases the lock and a standby takes over. A leader checks its lock
connection every ``check_s`` and stops its work as soon as a check fails or has
no answer within ``CHECK_TIMEOUT`` checks' time, since another process may lead
by then; a new leader waits ``TAKEOVER_WAIT`` checks' time before it starts,
longer than both together, so an old leader that lost its connection (rather
than died) has noticed and stopped first, and the two never work at once. A
check's answer may be slow without the connection being lost (a database or a
host busy for a moment): the timeout is four checks long, so such a moment
does not cost the leader its Run, whose Signal would be failed. When a check
finds the lock lost, ``on_lost`` is called at once, before the work is
cancelled: the Signal Worker kills its agent program there, since the program's
own graceful stop could outlast the new leader's wait. Losing the
database or the lock connection (an error, a hang past ``DATABASE_TIMEOUT_S``,
a session the server ended) sends a process back to standing by: it never
gives up leading for good. Nor does the work failing: it runs under
:func:`supervisor.supervise`, which logs, counts and restarts it while this
process keeps the lock (before, anything but a database error ended ``lead``,
and with it the process's leadership, unseen). On SQLite there is one process
(``serve`` holds a file lock), so it always leads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from agent_gateway.store import supervisor
from agent_gateway.store.engine import Store, libpq_dsn
from agent_gateway.store.unavailable import CONNECTION_LOST

logger = logging.getLogger(__name__)

RETRY_S = 0.5
CHECK_S = 0.25
# In checks (check_s): how long a check may take to answer, and how long a new leader waits
# before working, which must exceed one check's interval and timeout together.
CHECK_TIMEOUT = 4
TAKEOVER_WAIT = 6
# Connecting and asking for the lock give up after this long, and the standby starts over:
# a connection that hangs there would otherwise keep this process from ever leading.
DATABASE_TIMEOUT_S = 10.0
# What the lock connection raises when the database or the session goes away: any of it sends
# this process back to standing by (uncaught, it ended ``lead`` and the process never led again).
_LOST = CONNECTION_LOST


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


async def lead(
    store: Store,
    name: str,
    work: Callable[[], Awaitable[None]],
    *,
    retry_s: float = RETRY_S,
    check_s: float = CHECK_S,
    on_lost: Callable[[], object] | None = None,
) -> None:
    """Run ``work`` whenever this process leads ``name``; return when ``work`` returns.

    ``work`` that raises is restarted (``supervisor.supervise``, under ``name``), never the end of leading.
    ``on_lost`` (synchronous) is called when a check finds the lock lost, before ``work`` is cancelled.
    """

    async def supervised() -> None:
        await supervisor.supervise(name, work)

    if store.dialect != "postgresql":
        await supervised()
        return
    key = lock_key(name)
    while True:
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(libpq_dsn(store.url), timeout=DATABASE_TIMEOUT_S)
            while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key, timeout=DATABASE_TIMEOUT_S):
                await asyncio.sleep(retry_s)
            await asyncio.sleep(TAKEOVER_WAIT * check_s)
            logger.info("leading %s", name, extra={"action": "leadership_acquired"})
            if await _work_while_leading(conn, supervised, check_s, on_lost):
                return
            logger.warning("lost the lock connection: no longer leading %s", name, extra={"action": "leadership_lost"})
        except _LOST as exc:
            logger.warning("cannot reach the database to lead %s (%s)", name, type(exc).__name__)
        finally:
            if conn is not None:
                conn.terminate()  # closing the session releases the lock
        await asyncio.sleep(retry_s)


async def _work_while_leading(
    conn: asyncpg.Connection,
    work: Callable[[], Awaitable[None]],
    check_s: float,
    on_lost: Callable[[], object] | None = None,
) -> bool:
    """Run ``work`` while ``conn`` stays alive; True if it finished, False if leadership was lost
    (``on_lost`` called first)."""
    task = asyncio.create_task(work(), name="leader work")
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=check_s)
            if done:
                task.result()
                return True
            try:
                async with asyncio.timeout(CHECK_TIMEOUT * check_s):
                    await conn.execute("SELECT 1")
            except _LOST:
                if on_lost is not None:
                    on_lost()
                return False
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
