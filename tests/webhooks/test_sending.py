"""What an attempt refuses or stops at: private addresses (SSRF), redirects, large answers, and
the signature a receiver checks. Each against a real receiver, on both backends where stored."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac

import pytest
from standardwebhooks.webhooks import Webhook

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.webhooks import sender, signing
from agent_gateway.webhooks.sender import Sender
from tests.webhooks.conftest import endpoint, with_endpoints
from tests.webhooks.receiver import Receiver, new_secret
from tests.webhooks.test_delivery import stored, until


def test_signature_verifies_with_the_library_and_is_the_specified_hmac() -> None:
    secret = new_secret()
    at = datetime.datetime.now(datetime.UTC)
    body = '{"type":"decision.published","data":{"statement":"é"}}'.encode()
    headers = signing.headers(secret, "a-delivery-id", at, body)
    assert Webhook(secret).verify(body, headers) == {"type": "decision.published", "data": {"statement": "é"}}
    # The scheme itself: v1, base64 HMAC-SHA256 of "id.timestamp.body" with the key's bytes.
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"a-delivery-id.{int(at.timestamp())}.".encode() + body
    assert headers["webhook-signature"] == "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-timestamp"] == str(int(at.timestamp()))
    with pytest.raises(Exception):
        Webhook(new_secret()).verify(body, headers)  # another secret does not verify
    with pytest.raises(Exception):
        Webhook(secret).verify(body + b" ", headers)  # nor does another body


async def test_a_name_resolving_to_loopback_is_refused_at_connect_time(receiver: Receiver) -> None:
    """localhost passes the config's check (it is a name), and is refused once resolved."""
    out = Sender(timeout_s=10)
    try:
        url = f"http://localhost:{receiver.port}/hooks"
        body = b"{}"
        headers = signing.headers(receiver.secret, "id-1", datetime.datetime.now(datetime.UTC), body)
        error = await out.post(url, body, headers, allow_private=False)
        assert error is not None and error.startswith("refused: localhost resolves to ") and "allow_private" in error
        assert receiver.received == []
        assert await out.post(url, body, headers, allow_private=True) is None
        assert [r.verified for r in receiver.received] == [True]
    finally:
        await out.close()


async def test_redirects_are_not_followed(receiver: Receiver) -> None:
    receiver.answer = (307, {"location": "http://127.0.0.1:9/elsewhere"}, b"")
    out = Sender(timeout_s=10)
    try:
        body = b"{}"
        headers = signing.headers(receiver.secret, "id-1", datetime.datetime.now(datetime.UTC), body)
        assert await out.post(receiver.url, body, headers, allow_private=True) == "HTTP 307: redirects are not followed"
        assert len(receiver.received) == 1
    finally:
        await out.close()


async def test_a_large_answer_is_read_no_further_than_the_cap(receiver: Receiver) -> None:
    receiver.answer = (200, {}, b"x" * (sender.MAX_RESPONSE_BYTES * 64))
    out = Sender(timeout_s=10)
    try:
        body = b"{}"
        headers = signing.headers(receiver.secret, "id-1", datetime.datetime.now(datetime.UTC), body)
        assert await out.post(receiver.url, body, headers, allow_private=True) is None
    finally:
        await out.close()


async def test_an_attempt_without_an_answer_times_out(receiver: Receiver) -> None:
    receiver.hold.clear()
    out = Sender(timeout_s=0.5)
    try:
        body = b"{}"
        headers = signing.headers(receiver.secret, "id-1", datetime.datetime.now(datetime.UTC), body)
        assert await out.post(receiver.url, body, headers, allow_private=True) == "no answer within 0.5s"
    finally:
        receiver.hold.set()
        await out.close()


async def test_a_private_endpoint_is_refused_unless_allowed(settings: config.Settings, receiver: Receiver) -> None:
    local = f"http://localhost:{receiver.port}/hooks"
    refused = config.WebhookEndpoint(local, frozenset({"decision.published"}), receiver.secret, allow_private=False)
    gateway = Gateway(with_endpoints(settings, refused))
    await gateway.start()
    try:
        await gateway.publisher.publish("to a private address")
        [failed] = await until(lambda: stored(gateway, "failed"))
        assert failed.last_error is not None and failed.last_error.startswith("refused: localhost resolves to")
    finally:
        await gateway.stop()
    assert receiver.received == []
    allowed = config.WebhookEndpoint(local, frozenset({"decision.published"}), receiver.secret, allow_private=True)
    gateway = Gateway(with_endpoints(settings, allowed))
    await gateway.start()
    try:
        # The delivery refused before is sent now, as is a new one.
        await gateway.publisher.publish("allowed now")
        got = await asyncio.to_thread(receiver.wait_for, 2)
        # In either order: the refused one is sent once its retry is due, which may come after the new one.
        assert sorted(r.payload["data"]["statement"] for r in got) == ["allowed now", "to a private address"]
    finally:
        await gateway.stop()


async def test_metrics_count_deliveries_by_outcome(settings: config.Settings, receiver: Receiver) -> None:
    import httpx

    receiver.fail_first = 1
    gateway = Gateway(with_endpoints(settings, endpoint(receiver, ("decision.published",))))
    await gateway.start()
    try:
        assert gateway.ops_app is not None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as ops:
            before = _samples((await ops.get("/metrics")).text)
            await gateway.publisher.publish("counted")
            await until(lambda: stored(gateway, "delivered"))
            after = _samples((await ops.get("/metrics")).text)
            ready = await ops.get("/readyz")
        delivered = 'agent_gateway_webhook_deliveries_total{outcome="delivered"}'
        failed = 'agent_gateway_webhook_deliveries_total{outcome="failed"}'
        assert after[delivered] - before.get(delivered, 0) == 1
        assert after[failed] - before.get(failed, 0) == 1
        assert after["agent_gateway_webhook_delivery_latency_seconds_count"] - before.get(
            "agent_gateway_webhook_delivery_latency_seconds_count", 0
        ) == 1
        assert ready.json()["checks"]["webhooks"] == "ok"
    finally:
        await gateway.stop()


def _samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("agent_gateway_webhook"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
