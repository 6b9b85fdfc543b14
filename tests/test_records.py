"""records.py: each record's wire shape is the one the store's rows produce, and the kit can import it alone."""

from __future__ import annotations

import subprocess
import sys
import typing
import uuid
from collections.abc import Mapping
from typing import Any

from agent_gateway import records
from agent_gateway.auth import service as auth_service
from agent_gateway.decisions import service as decisions_service
from agent_gateway.gateway import Gateway
from agent_gateway.messages import service as messages_service
from agent_gateway.scheduler import service as scheduler_service
from agent_gateway.signals import service as signals_service
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.window import Window
from agent_gateway.users import service as users_service


def fields(record: type) -> set[str]:
    return set(record.__annotations__)


async def test_each_records_fields_are_what_its_row_produces(gateway: Gateway) -> None:
    store = gateway.store
    produced: dict[type, list[Mapping[str, Any]]] = {}
    async with store.transaction() as conn:
        user = await users_service.admit(conn)
        inbound = await messages_service.receive(conn, user.id, "hello")
        outbound = await messages_service.send(conn, user.id, "hi")
        signal_id = await signals_service.emit(conn, "test.kind", {"a": 1})
        await run_queries.record(conn, signal_id=signal_id, prompts=[(str(uuid.uuid4()), "session", "prompt")])
        once, _ = await scheduler_service.put(conn, "once", {"kind": "once", "at": "2999-01-01T00:00:00Z"})
        cron, _ = await scheduler_service.put(conn, "cron", {"kind": "cron", "expr": "@daily"}, data=1)
        token = await auth_service.issue_token(conn, user.id, ttl_ms=60_000)
    decision = await gateway.publisher.publish("a statement")
    # Read back from the database, so that each shape is a stored row's, not a freshly built value's.
    async with store.read() as conn:
        produced[records.User] = [(await users_service.get(conn, user.id)).to_json()]
        produced[records.Signal] = [(await signals_service.get_signal(conn, signal_id)).to_json()]
        produced[records.Run] = [run.to_json() for run in await signals_service.list_runs(conn, 10, signal_id)]
        produced[records.Schedule] = [(await scheduler_service.get(conn, name)).to_json() for name in ("once", "cron")]
    produced[records.Message] = [m.to_json() for m in await messages_service.read(store, user.id, Window(limit=10))]
    produced[records.Decision] = [(await decisions_service.get(store, decision.seq)).to_json()]
    produced[records.Token] = [token.to_json()]
    assert [m["seq"] for m in produced[records.Message]] == [inbound.seq, outbound.seq]
    assert {s["spec"]["kind"] for s in produced[records.Schedule]} == {once.kind, cron.kind}
    for record, rows in produced.items():
        assert rows, record.__name__
        for row in rows:
            assert set(row) == fields(record), record.__name__
    assert set(produced[records.Token][0]["user"]) == fields(records.User)


def test_each_list_wraps_its_record() -> None:
    lists = {
        records.MessageList: records.Message,
        records.DecisionList: records.Decision,
        records.ScheduleList: records.Schedule,
        records.SignalList: records.Signal,
        records.RunList: records.Run,
        records.UserList: records.User,
    }
    for wrapper, record in lists.items():
        ((_, annotation),) = wrapper.__annotations__.items()
        assert (typing.get_origin(annotation), typing.get_args(annotation)) == (list, (record,)), wrapper.__name__


def test_the_kit_imports_no_part_of_the_server() -> None:
    """The kit runs in the sandbox: importing it, records included, loads nothing else of the gateway."""
    code = (
        "import sys, agent_gateway.agent\n"
        "print('\\n'.join(name for name in sys.modules if name.split('.')[0] in "
        "('agent_gateway', 'fastapi', 'starlette', 'pydantic', 'sqlalchemy')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert set(loaded) == {
        "agent_gateway",
        "agent_gateway.agent",
        "agent_gateway.agent.client",
        "agent_gateway.agent.serve",
        "agent_gateway.records",
    }
