"""The deliverer: sends the outbox's due deliveries, at least once, with retries.

Which processes run one: every process with the ``worker`` role, leading the
Signal Worker or standing by, since deliveries are claimed row by row
(``store.queries.webhooks``; ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), so several
deliverers share the work and never send one delivery at the same time.

Shape: a lane (a task) per endpoint, each as the Scheduler's timer: drain —
claim the endpoint's due deliveries, oldest first, in batches, and send them
one after the other — then sleep until its next one is due, at most
:data:`POLL_S`; the ``webhooks`` channel, woken by the commit of any
transaction that wrote a delivery (NOTIFY across processes on PostgreSQL),
cuts the sleep short, and the poll is the fallback for a wake-up lost. The
lanes wait on nothing of each other's: an endpoint that is slow or never
answers holds back its own deliveries only. A process makes at most one
attempt per endpoint at a time, so as many at once as there are endpoints.

Leases: a claim holds a batch until an attempt's timeout and
:data:`LEASE_MARGIN_S` after it. A delivery whose turn in its batch comes
later (after slow attempts) than an attempt begun then could end has its lease
renewed first, only while its claim still holds: one whose lease ran out and
that another sender took meanwhile is not sent from here. So no delivery is
sent from two places while an attempt of it can still run.

Order: an endpoint's deliveries are sent one after the other in event order.
A delivery waiting for a retry does not hold back the ones after it, and two
processes may each hold some of one endpoint's deliveries, so a receiver
orders by the payload's ``timestamp`` where it matters.

Retries: after the n-th failed attempt the next comes ``first_retry ×
3^(n-1)`` later, at most :data:`MAX_RETRY_WAIT_S`; one that would come later than
``retry_for`` after the event (or after the operator's ``webhooks retry``)
is not made: the delivery is dead.

Logs name the delivery, its event and the endpoint's origin (scheme, host,
port), never the URL's path (some receivers keep a secret there), a body or
a secret.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

import httpx

from agent_gateway import clock
from agent_gateway.config import Settings, WebhookEndpoint
from agent_gateway.ops import metrics
from agent_gateway.store import outbox as shared_outbox
from agent_gateway.store import woken
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import webhooks as queries
from agent_gateway.store.vacuum import Vacuum
from agent_gateway.webhooks import outbox, signing
from agent_gateway.webhooks.sender import Sender

logger = logging.getLogger(__name__)

# Deliveries claimed per transaction.
CLAIM_BATCH = 32
# The longest sleep without looking: the fallback for a wake-up that never came.
POLL_S = 5.0
BACKOFF_FACTOR = 3
MAX_RETRY_WAIT_S = 6 * 3600.0
# How long past its timeout an attempt's claim holds: a sender that died mid-attempt leaves the
# delivery to be sent again this long after it claimed it, never while the attempt can still run.
LEASE_MARGIN_S = 10.0
# An attempt begins under its claim's lease only while that lasts this long past the attempt's
# timeout; one further down a batch, after slow attempts, renews its lease first (Deliverer._hold).
MIN_MARGIN_S = 5.0


def next_attempt(
    attempts: int, now: datetime, retry_from: datetime, *, first_retry_s: float, retry_for: timedelta
) -> datetime | None:
    """When to try again after the ``attempts``-th failed attempt; None when retries are over."""
    return shared_outbox.next_attempt(
        attempts, now, retry_from, first_retry_s=first_retry_s, retry_for=retry_for,
        factor=BACKOFF_FACTOR, max_wait_s=MAX_RETRY_WAIT_S,
    )


@dataclasses.dataclass(frozen=True)
class Policy:
    """How deliveries are sent and retried (``[webhook_delivery]``)."""

    retry_for: timedelta
    first_retry_s: float
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(settings.webhook_retry_for, settings.webhook_first_retry_ms / 1000, settings.webhook_timeout_ms / 1000)


class Deliverer(woken.WokenLoop):
    """One process's deliverer loop; :meth:`start` and :meth:`stop` are called by the gateway."""

    name = "webhook deliverer"

    def __init__(self, store: Store, endpoints: Sequence[WebhookEndpoint], policy: Policy) -> None:
        super().__init__(store, outbox.CHANNEL)
        self.endpoints = {endpoint.url: endpoint for endpoint in endpoints}
        self.policy = policy
        self._sender = Sender(policy.timeout_s)
        self._backoff = functools.partial(next_attempt, first_retry_s=policy.first_retry_s, retry_for=policy.retry_for)
        # Each claim and outcome leaves dead row versions in the outbox's index (store.vacuum).
        self._vacuum = Vacuum(store, "webhook_deliveries")
        # Each lane's own wake-up, subscribed before its first pass as the loop's is (store.woken).
        self._wakes = {url: store.subscribe(outbox.CHANNEL) for url in self.endpoints}

    async def stop(self) -> None:
        """Let the attempts in progress end (up to a while; their deliveries are sent again
        once their lease ends), then end the loop."""
        self._stopping = True
        for wake in self._wakes.values():
            wake.nudge()
        await super().stop()
        for wake in self._wakes.values():
            self.store.unsubscribe(outbox.CHANNEL, wake)
        await self._vacuum.close()
        await self._sender.close()

    async def _run(self) -> None:
        # URLs no table names any more (an endpoint removed while deliveries to it were open) get a
        # lane too, whose attempts fail saying so, until their deliveries are dead.
        async with self.store.read() as conn:
            unnamed = [url for url in await queries.open_urls(conn) if url not in self.endpoints]
        lanes = [
            asyncio.create_task(self._lane(url), name=f"{self.name} {_origin(url)}") for url in [*self.endpoints, *unnamed]
        ]
        try:
            for lane in asyncio.as_completed(lanes):
                # A failure (the database went away) raises: the supervisor restarts every lane (store.woken).
                await lane
        finally:
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
        while not self._stopping:  # only unnamed URLs' lanes, all ended: wait to be stopped
            await self._wake.wait(None)

    async def _lane(self, url: str) -> None:
        """Send the deliveries to ``url`` as they come due, until stopped, one after the other and
        whatever other endpoints' lanes are waiting on; a URL no table names ends once it has no
        open delivery left (none is written to it any more)."""
        if url not in self._wakes:
            self._wakes[url] = self.store.subscribe(outbox.CHANNEL)
        while not self._stopping:
            delay = await self.step(url)
            if delay is None and url not in self.endpoints:
                return
            await self._wakes[url].wait(POLL_S if delay is None else delay)

    async def step(self, url: str) -> float | None:
        """Send every delivery to ``url`` due now; return how many seconds to sleep before the next
        look (None: no delivery to it is open)."""
        while not self._stopping:
            now = clock.now()
            async with self.store.transaction() as conn:
                claimed = await outbox.composed(conn, await queries.claim_due(
                    conn, url=url, now=clock.format_instant(now), lease=self._lease(now), limit=CLAIM_BATCH
                ))
            if not claimed:
                break
            self._vacuum.claimed(len(claimed))
            for delivery in claimed:
                if self._stopping:  # the rest are sent again once their lease ends
                    break
                held = await self._hold(delivery)
                if held is None:
                    self._superseded(delivery)
                else:
                    await asyncio.shield(self._attempt(held))
        async with self.store.read() as conn:
            due = await queries.next_due(conn, url=url)
        if due is None:
            return None
        return max(0.0, min((clock.parse_instant(due) - clock.now()).total_seconds(), POLL_S))

    def _lease(self, now: datetime) -> str:
        """The end of a claim made ``now``: past the end of an attempt begun now, by the margin."""
        return clock.format_instant(now + timedelta(seconds=self.policy.timeout_s + LEASE_MARGIN_S))

    async def _hold(self, delivery: queries.Claimed) -> queries.Claimed | None:
        """``delivery`` under a lease that lasts past an attempt begun now: its claim's while that
        has at least :data:`MIN_MARGIN_S` to spare, else renewed; None when its claim ran out and
        another sender has taken it (it must not be sent from here too)."""
        now = clock.now()
        if clock.parse_instant(delivery.lease) - now >= timedelta(seconds=self.policy.timeout_s + MIN_MARGIN_S):
            return delivery
        return await queries.renew(self.store, delivery, lease=self._lease(now))

    def _superseded(self, delivery: queries.Claimed) -> None:
        metrics.webhook_deliveries.labels("superseded").inc()
        logger.info(
            "webhook delivery %s (%s) to %s: not sent from here, its claim ran out before its turn and another "
            "sender took it", delivery.id, delivery.event, _origin(delivery.url),
            extra={"action": "deliver_webhook", "delivery": delivery.id, "event": delivery.event, "status": "superseded"},
        )

    async def _attempt(self, delivery: queries.Claimed) -> None:
        """Send one claimed delivery and record how it went."""
        endpoint = self.endpoints.get(delivery.url)
        started = time.perf_counter()
        if endpoint is None:
            error: str | None = "no [[webhooks]] table has this url any more"
        elif delivery.body is None:
            error = f"Decision {delivery.decision_seq} is not in the log"
        else:
            body = delivery.body.encode()
            headers = signing.headers(endpoint.secret, delivery.id, clock.now(), body)
            error = await self._sender.post(delivery.url, body, headers, allow_private=endpoint.allow_private)
        metrics.webhook_attempt_duration.observe(time.perf_counter() - started)
        outcome, now = await queries.record(self.store, delivery, error, self._backoff)
        metrics.webhook_deliveries.labels(outcome).inc()
        if outcome == "delivered":
            metrics.webhook_delivery_latency.observe((now - clock.parse_instant(delivery.created_at)).total_seconds())
        logger.log(
            logging.INFO if error is None else logging.WARNING,
            "webhook delivery %s (%s) to %s: %s%s", delivery.id, delivery.event, _origin(delivery.url), outcome,
            "" if error is None else f" after attempt {delivery.attempts}: {error}",
            extra={"action": "deliver_webhook", "delivery": delivery.id, "event": delivery.event, "status": outcome},
        )


def _origin(url: str) -> str:
    """The URL without its path and query, which may hold a receiver's secret."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:  # stored before the configuration refused such URLs: still never its path
        return "/".join(url.split("/", 3)[:3])
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"
