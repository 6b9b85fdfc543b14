"""Revision 0004: a decision.published delivery holds its Decision's number instead of a copy."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agent_gateway.store import migrate
from tests.conftest import downgrade, engine_at

pytestmark = pytest.mark.processes

COPIED = '{"type":"message.inbound","timestamp":"2026-11-25T10:00:00.000Z","data":{"text":"hi"}}'
DECISION = {"seq": 7, "statement": '"we ship"', "jws": "e30.e30.c2ln", "created_at": "2026-11-26T09:30:00.000Z"}
# What revision 0003 would have copied for that Decision: its record, keys in the spec's order.
DECISION_BODY = (
    '{"type":"decision.published","timestamp":"2026-11-26T09:30:00.000Z",'
    '"data":{"seq":7,"statement":"we ship","jws":"e30.e30.c2ln","createdAt":"2026-11-26T09:30:00.000Z"}}'
)
deliveries = sa.table(
    "webhook_deliveries", *(sa.column(name) for name in (
        "position", "id", "url", "event", "body", "decision_seq", "created_at", "state", "attempts",
        "next_attempt_at", "retry_from",
    ))
)


def delivery(id: str, event: str, **columns: object) -> dict[str, object]:
    return {
        "id": id, "url": "http://127.0.0.1:9/hooks", "event": event, "created_at": "2026-11-26T09:30:00.000Z",
        "state": "pending", "attempts": 0, "next_attempt_at": "2026-11-26T09:30:00.000Z",
        "retry_from": "2026-11-26T09:30:00.000Z", **columns,
    }


async def test_upgrade_keeps_copies_refers_from_then_on_and_downgrade_copies_back(empty_database_url: str) -> None:
    async with engine_at(empty_database_url, "0003") as engine:
        async with engine.begin() as conn:
            await conn.execute(
                deliveries.insert().values(delivery("00000000-0000-7000-8000-000000000001", "message.inbound", body=COPIED))
            )
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(sa.table("decisions", *(sa.column(c) for c in DECISION)).insert().values(DECISION))
            await conn.execute(deliveries.insert().values(
                delivery("00000000-0000-7000-8000-000000000002", "decision.published", decision_seq=7)
            ))
            rows = (await conn.execute(sa.select(deliveries.c.id, deliveries.c.body, deliveries.c.decision_seq))).all()
            assert sorted(rows) == [
                ("00000000-0000-7000-8000-000000000001", COPIED, None),
                ("00000000-0000-7000-8000-000000000002", None, 7),
            ]
        # Exactly one of the two: a body, or the number of the Decision it is made from.
        for neither_or_both in ({}, {"body": COPIED, "decision_seq": 7}):
            with pytest.raises(sa.exc.IntegrityError):
                async with engine.begin() as conn:
                    await conn.execute(deliveries.insert().values(
                        delivery("00000000-0000-7000-8000-000000000003", "decision.published", **neither_or_both)
                    ))
        async with engine.begin() as conn:
            await conn.run_sync(downgrade, "0003")
        async with engine.begin() as conn:
            rows = (await conn.execute(sa.select(deliveries.c.id, deliveries.c.body).order_by(deliveries.c.id))).all()
        assert [tuple(row) for row in rows] == [
            ("00000000-0000-7000-8000-000000000001", COPIED),
            ("00000000-0000-7000-8000-000000000002", DECISION_BODY),
        ]
        await migrate.upgrade(engine)  # and up again
