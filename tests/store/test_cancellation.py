"""A cancel is never swallowed: a loop told to stop at the moment its bounded wait ends still stops.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the cancel
arrives in the same turn of the loop as that result, and the cancel is lost
(fixed in 3.12). The leader's check of its lock connection ran under it twice a
second: a gateway whose channel was stopped at that moment went on leading, and
its ``stop`` waited forever (seen once as a 900 s teardown hang of the Matrix
tests). The gateway bounds its waits with ``asyncio.timeout`` instead, which
cannot lose a cancel; the second test keeps ``wait_for`` out of the code.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import agent_gateway
from agent_gateway.store import leadership


class LockConnection:
    """The leader's lock connection, whose ``SELECT 1`` the test answers when it chooses."""

    def __init__(self) -> None:
        self.checks: list[asyncio.Future[None]] = []
        self.checked = asyncio.Event()

    def execute(self, query: str) -> asyncio.Future[None]:
        check = asyncio.get_running_loop().create_future()
        self.checks.append(check)
        self.checked.set()
        return check


async def test_a_leader_cancelled_as_its_check_answers_stops() -> None:
    conn = LockConnection()
    never = asyncio.Event()
    leading = asyncio.create_task(leadership._work_while_leading(conn, never.wait, 0.01))  # type: ignore[arg-type]
    async with asyncio.timeout(120):
        await conn.checked.wait()
    # The check's answer and the cancel in one turn of the loop: the race the hang needed.
    conn.checks[0].set_result(None)
    leading.cancel()
    done, _ = await asyncio.wait({leading}, timeout=120)
    assert done, "the leader went on checking its lock after it was cancelled"
    assert leading.cancelled()
    assert len(conn.checks) == 1


def test_no_bounded_wait_can_lose_a_cancel() -> None:
    source = Path(agent_gateway.__file__).parent
    calls = [
        f"{path.relative_to(source)}:{node.lineno}"
        for path in sorted(source.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "wait_for"
    ]
    assert calls == [], "asyncio.wait_for loses a cancel on Python 3.11: use asyncio.timeout"
