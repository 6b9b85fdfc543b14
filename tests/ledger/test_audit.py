"""``agent-gateway audit --ledger`` against a real ``serve``: it verifies the Run ledger, sums up
what it says, flags a Run of a Signal the operator emitted (whatever its kind), and names a
rewritten entry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent_gateway import deployment
from agent_gateway.signals import service as signals
from agent_gateway.store.engine import Store
from tests.cli.test_main import one_error_line
from tests.cli.test_operator_errors import run_sql
from tests.served import ServedGateway
from tests.transparency.test_audit import audit, audited, token_of_a_user
from tests.transparency.test_witnessed import VKEYS

pytestmark = pytest.mark.processes

# A guard against a hung test, not a measurement.
DEADLINE_S = 300


@pytest.fixture
def nudged_gateway(tmp_path: Path, database_url: str) -> Iterator[ServedGateway]:
    """A served gateway whose operator also handles Signals of a kind of their own."""
    directory = tmp_path / "deployment"
    deployment.write(directory)
    with (directory / "gateway.toml").open("a") as config:
        config.write('\n[handlers."operator.nudge"]\ntemplate = "Nudge: {{ why }}"\n')
    extra = {"AGENT_GATEWAY_DATABASE_URL": database_url, "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10"}
    gateway = ServedGateway.spawn_on_free_ports(directory, extra)
    try:
        yield gateway
    finally:
        gateway.stop()


async def emit(url: str, kind: str, payload: object) -> None:
    """What an operator's Python does (signals.service.emit), in a process of its own."""
    store = Store(url)
    try:
        async with store.transaction() as conn:
            await signals.emit(conn, kind, payload)
    finally:
        await store.close()


def wait_for_entries(gateway: ServedGateway, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while httpx.get(f"{gateway.agent_url}/ledger/checkpoint", timeout=60).text.split("\n")[1] != str(count):
        assert time.monotonic() < deadline, f"the ledger did not reach {count} entries"
        time.sleep(0.05)


def test_the_audit_sums_up_the_ledger_and_flags_the_signals_the_operator_emitted(
    nudged_gateway: ServedGateway, tmp_path: Path
) -> None:
    gateway = nudged_gateway
    token = token_of_a_user(gateway)
    state = tmp_path / "ledger-state.json"
    empty = audited(audit(gateway, "--ledger", "--state", str(state), token=token))
    assert empty["treeSize"] == 1 and empty["origin"].startswith("agent-gateway/ledger/")
    assert [change["seq"] for change in empty["instructionChanges"]] == [1]
    sent = httpx.post(f"{gateway.public_url}/messages", json={"text": "hello"}, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert sent.status_code == 201, sent.text
    url = gateway.env["AGENT_GATEWAY_DATABASE_URL"]
    asyncio.run(emit(url, "operator.nudge", {"why": "be nice"}))
    # The operator's code forging a Message's Signal: its kind is a Message's, its origin is not.
    asyncio.run(emit(url, "message.received", {**sent.json(), "text": "not what the User wrote"}))
    wait_for_entries(gateway, 4)
    report = audited(audit(gateway, "--ledger", "--state", str(state), token=token))
    assert (report["treeSize"], report["audited"], report["instructionChanges"]) == (4, 3, [])
    assert report["runsByKind"] == {"message.received": 2, "operator.nudge": 1}
    assert sorted(entry["kind"] for entry in report["direct"]) == ["message.received", "operator.nudge"]
    assert all(entry["seq"] in (2, 3, 4) for entry in report["direct"])
    [direct] = [entry for entry in report["direct"] if entry["kind"] == "operator.nudge"]
    # The Decision log's state is not the ledger's: the origins differ, and the audit says so.
    line = one_error_line(audit(gateway, "--state", str(state), token=token))
    assert "not the remembered" in line
    # An entry rewritten in the database: a fresh audit finds the leaves do not rebuild the root.
    run_sql(
        gateway.env["AGENT_GATEWAY_DATABASE_URL"],
        f"UPDATE ledger_entries SET leaf = replace(leaf, 'operator.nudge', 'message.received') WHERE seq = {direct['seq']}",
    )
    line = one_error_line(audit(gateway, "--ledger", token=token))
    assert "checkpoint 4: the entries after seq 0 do not rebuild its root" in line
    # No witness cosigns this ledger: an audit that asks for its witnessed checkpoint fails in one line.
    run_sql(
        gateway.env["AGENT_GATEWAY_DATABASE_URL"],
        f"UPDATE ledger_entries SET leaf = replace(leaf, 'message.received', 'operator.nudge') WHERE seq = {direct['seq']}",
    )
    line = one_error_line(audit(gateway, "--ledger", "--witness", VKEYS[0], token=token))
    assert "the witnessed checkpoint: none yet" in line
