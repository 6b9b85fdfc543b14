"""A URL the HTTP client cannot use: refused at start, and should one be stored all the same, its
attempts fail, recorded and retried as any other's, and the deliverer goes on. On both backends."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent_gateway import config
from agent_gateway.config import SettingsError
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import webhooks as queries
from agent_gateway.webhooks import deliverer, outbox
from agent_gateway.webhooks.deliverer import Deliverer
from agent_gateway.webhooks.sender import Sender
from tests.webhooks.receiver import WAIT_S, Receiver, new_secret
from tests.webhooks.test_deliverer_leases import policy, write_pending

# urllib splits it; httpx refuses its host ("ü-" is no valid IDNA label).
UNUSABLE = "https://ü-.example.com/hook"


def test_an_unusable_url_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[auth]\ntoken_ttl_ms = 1000\n[[webhooks]]\nurl = "{UNUSABLE}"\nevents = ["run.ended"]\nsecret_env = "S"\n'
    )
    with pytest.raises(SettingsError) as caught:
        config.load(path, environ={"S": new_secret()})
    assert str(caught.value) == (
        f"webhooks[0].url: must be an http:// or https:// URL with a valid host and no credentials (got '{UNUSABLE}')"
    )


async def test_the_sender_makes_an_unusable_url_a_failed_attempt() -> None:
    out = Sender(timeout_s=10)
    try:
        error = await out.post(UNUSABLE, b"{}", {}, allow_private=False)
    finally:
        await out.close()
    assert error is not None and error.startswith("invalid URL: ") and "\n" not in error


async def test_the_sender_makes_any_error_a_failed_attempt(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    async def surprising(self, url, allow_private):  # type: ignore[no-untyped-def]
        raise RuntimeError("something no one foresaw")

    monkeypatch.setattr(Sender, "_resolve", surprising)
    out = Sender(timeout_s=10)
    try:
        assert await out.post(receiver.url, b"{}", {}, allow_private=True) == "RuntimeError: something no one foresaw"
    finally:
        await out.close()
    assert receiver.received == []


async def test_a_stored_delivery_to_an_unusable_url_fails_and_the_deliverer_goes_on(
    store: Store, receiver: Receiver
) -> None:
    """One written before the configuration refused such URLs (or by code that builds its endpoint
    itself): its attempt is recorded, retried per the policy until dead, and every other endpoint's
    deliveries go on."""
    unusable = config.WebhookEndpoint(UNUSABLE, frozenset({outbox.RUN_ENDED}), new_secret())
    usable = config.WebhookEndpoint(receiver.url, frozenset({outbox.RUN_ENDED}), receiver.secret, allow_private=True)
    restarted = restarts()
    # No retry comes within a moment of the event: the first failed attempt is the last.
    sender = Deliverer(store, [unusable, usable], policy(retry_for=datetime.timedelta(seconds=1)))
    [doomed] = await write_pending(store, UNUSABLE, 1)
    sender.start()
    try:
        [sent] = await write_pending(store, receiver.url, 1)
        [got] = await asyncio.to_thread(receiver.wait_for, 1)
        assert got.id == sent
        async with asyncio.timeout(WAIT_S):
            while (found := await state_of(store, doomed)) is None or found.state != "dead":
                await asyncio.sleep(0.05)
        assert sender.running
        # Its URL is named in the log without its path (some receivers keep a secret there).
        assert deliverer._origin(UNUSABLE + "/secret?token=1") == "https://ü-.example.com"
    finally:
        await sender.stop()
    assert found.attempts == 1 and found.last_error is not None and found.last_error.startswith("invalid URL: ")
    assert restarts() == restarted  # the loop never failed


async def state_of(store: Store, id: str) -> queries.Delivery | None:
    async with store.read() as conn:
        return next((d for d in await queries.newest(conn, limit=100) if d.id == id), None)


def restarts() -> float:
    return REGISTRY.get_sample_value("agent_gateway_loop_restarts_total", {"loop": Deliverer.name}) or 0.0
