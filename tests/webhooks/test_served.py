"""Webhooks from a real ``agent-gateway serve``: a SIGKILL loses no delivery, two processes on
PostgreSQL never send one delivery at the same time, and the operator's CLI."""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests import served
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.e2e

SECRET_VARIABLE = "TEST_WEBHOOK_SECRET"


def hooked_env(receiver: Receiver, events: tuple[str, ...] = ("decision.published",), **extra: str) -> dict[str, str]:
    """The variables that make ``receiver`` a gateway's endpoint (the list as JSON, the secret by name)."""
    table = {"url": receiver.url, "events": list(events), "secret_env": SECRET_VARIABLE, "allow_private": True}
    return {
        "AGENT_GATEWAY_WEBHOOKS": orjson.dumps([table]).decode(),
        SECRET_VARIABLE: receiver.secret,
        "AGENT_GATEWAY_WEBHOOK_DELIVERY_FIRST_RETRY_MS": "100",
        **extra,
    }


def publish(gateway: served.ServedGateway, statement: str) -> dict:
    response = httpx.post(f"{gateway.agent_url}/decisions", json={"statement": statement}, timeout=120)
    assert response.status_code == 201, response.text
    return response.json()


def test_a_gateway_killed_mid_delivery_delivers_after_restart(
    tmp_path: Path, database_url: str, receiver: Receiver
) -> None:
    receiver.hold.clear()  # the first attempt is held open: the gateway is mid-delivery
    # A short timeout keeps the claim's lease (timeout + 10 s) short for the restarted gateway.
    env = hooked_env(receiver, AGENT_GATEWAY_WEBHOOK_DELIVERY_TIMEOUT_MS="2000")
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        decision = publish(gateway, "delivered even so")
        assert receiver.holding.wait(served.START_TIMEOUT_S)
        assert gateway.stop(signal.SIGKILL) == -signal.SIGKILL
        receiver.fail_first = 1  # the held attempt's answer never reached the killed gateway
        receiver.hold.set()
        restarted = served.ServedGateway.spawn(gateway.directory, gateway.env)
        try:
            [held, accepted] = receiver.wait_for(2, accepted=False)
            assert held.status == 500 and accepted.status == 204
            assert accepted.id == held.id and accepted.body == held.body and accepted.verified
            assert accepted.payload == {"type": "decision.published", "timestamp": decision["createdAt"], "data": decision}
            [listed] = restarted.cli_json("webhooks", "deliveries")
            assert (listed["id"], listed["event"], listed["url"]) == (accepted.id, "decision.published", receiver.url)
        finally:
            restarted.stop()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_processes_never_send_one_delivery_at_once(tmp_path: Path, database_url: str, receiver: Receiver) -> None:
    receiver.delay_s = 0.02  # each request takes a moment: time for another sender to collide
    env = hooked_env(receiver)
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as first:
        second = served.ServedGateway.spawn_on_free_ports(first.directory, first.env)  # ports of its own
        try:
            count = 60
            for n in range(count):
                publish(first if n % 2 else second, f"statement {n}")
            got = receiver.wait_for(count)
            assert receiver.overlapped == []
            assert len(got) == count and len({r.id for r in got}) == count  # none sent twice
            assert all(r.verified for r in got)
            # Each was recorded delivered (after its 2xx), by exactly one of the two processes (their logs say which).
            deadline = time.monotonic() + served.START_TIMEOUT_S
            while len(first.cli_json("webhooks", "deliveries", "--state", "delivered", "--limit", "1000")) < count:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            delivered = collections.Counter(
                line.split("webhook delivery ", 1)[1].split(" ", 1)[0]
                for gateway in (first, second)
                for line in gateway.output().splitlines()
                if "webhook delivery " in line and line.endswith(": delivered")
            )
            assert delivered == {r.id: 1 for r in got}
        finally:
            second.stop()
