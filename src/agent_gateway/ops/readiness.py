"""Readiness: can this process do its work now? Checked on request, each check bounded in time.

Ready means the database answers, holds the current schema, and (for a
process with those roles) the Signal Worker's and the Scheduler's loops are
alive. A check that cannot finish within :data:`CHECK_TIMEOUT_S` fails: the
answer never hangs on a database that does not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agent_gateway.ops.view import GatewayView
from agent_gateway.store import migrate

CHECK_TIMEOUT_S = 2.0
OK = "ok"
LOOP_NAMES = {"worker": "Signal Worker", "scheduler": "Scheduler", "webhooks": "webhook deliverer"}


async def check(gateway: GatewayView) -> dict[str, str]:
    """Each check's outcome, ``"ok"`` or why not."""
    checks = {"database": await _bounded(lambda: _database(gateway))}
    for loop, alive in gateway.loops_alive().items():
        checks[loop] = OK if alive else f"the {LOOP_NAMES[loop]} loop is not running"
    return checks


async def _database(gateway: GatewayView) -> str:
    found = await migrate.schema(gateway.store.engine)  # a connection and a read: it answers
    if not found.is_current:
        return f"the database schema is not current ({found.revision or 'none'}): run agent-gateway migrate"
    return OK


async def _bounded(check: Callable[[], Awaitable[str]]) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            return await check()
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g}s"
    except Exception as exc:  # the database refused or is gone: say which, never a 500
        return f"unavailable: {type(exc).__name__}"
