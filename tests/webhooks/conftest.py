"""Fixtures for webhooks: a real receiver, and an in-process gateway whose endpoint it is."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator

import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from tests.webhooks import receiver as receivers
from tests.webhooks.receiver import Receiver

# A Run for each inbound Message; with no agent program configured, each Run fails, and so
# does its Signal: one Message makes every event but decision.published and schedule.fired.
HANDLERS = {"message.received": {"template": "A message from user {{ userId }}: {{ text }}"}}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receivers.running() as running:
        yield running


def with_endpoints(settings: config.Settings, *endpoints: config.WebhookEndpoint) -> config.Settings:
    """``settings`` with these endpoints, retried quickly (a test waits on events, not speed)."""
    return dataclasses.replace(
        settings, webhooks=endpoints, webhook_first_retry_ms=100, webhook_timeout_ms=10_000, handlers=HANDLERS
    )


def endpoint(receiver: Receiver, events: tuple[str, ...] = config.WEBHOOK_EVENTS, **options: object) -> config.WebhookEndpoint:
    return config.WebhookEndpoint(
        url=receiver.url, events=frozenset(events), secret=receiver.secret, allow_private=True, **options  # type: ignore[arg-type]
    )


@pytest.fixture
async def hooked(settings: config.Settings, receiver: Receiver) -> AsyncIterator[Gateway]:
    """A gateway (every role) whose one endpoint, ``receiver``, subscribes to every event."""
    gateway = Gateway(with_endpoints(settings, endpoint(receiver)))
    await gateway.start()
    yield gateway
    await gateway.stop()
