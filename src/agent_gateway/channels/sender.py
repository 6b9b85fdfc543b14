"""A channel's sender: sends its outbox's due deliveries, with retries, from the process that leads it.

Shape (as the webhook deliverer): drain — claim the due deliveries, oldest
first, and send them one after the other, in order — then sleep until the
next is due, at most :data:`POLL_S`; the commit of a transaction that wrote
one of this channel's deliveries (NOTIFY across processes on PostgreSQL) cuts
the sleep short. Claims are the shared outbox's (``store.outbox``), so even two
senders of one channel never send one delivery at the same time, and the
network de-duplicates a resend of one whose outcome was lost (Matrix: the
delivery's id is the transaction id).

Retries: after the n-th failed attempt the next comes ``FIRST_RETRY_S ×
2^(n-1)`` later, at most :data:`MAX_RETRY_WAIT_S` (60 s), across restarts and
outages; a delivery still failing :data:`RETRY_FOR` after it was written is
dead (``agent-gateway channels deliveries --state dead``).

A delivery without a conversation (a User who never wrote) gets one opened on
its identity first, recorded as the User's conversation and on the delivery,
so a retry sends into the same one. So does one written for a direct room that
a read has since found shared (someone invited): the read took that room off it
(``queries.forget_private``), and what was meant for the User alone goes to
their private conversation instead.

A delivery ended while claimed (its identity unlinked from its User:
``channels.identities.unlink``) is not sent when its turn in the batch comes;
only one whose attempt had already begun may still go out. Nor is one whose
lease ran out while the sends before it in its batch were slow and which
another sender claimed (after a change of leadership): a delivery's lease is
renewed, while its claim still holds, before an attempt that could outlast it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import timedelta

from agent_gateway import clock
from agent_gateway.channels import identities, outbox
from agent_gateway.channels.network import Network, SendFailed
from agent_gateway.ops import metrics
from agent_gateway.store import outbox as shared_outbox
from agent_gateway.store import woken
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries

logger = logging.getLogger(__name__)

CLAIM_BATCH = 16
POLL_S = 5.0
RETRY_AFTER_ERROR_S = 1.0
FIRST_RETRY_S = 1.0
BACKOFF_FACTOR = 2
MAX_RETRY_WAIT_S = 60.0
RETRY_FOR = timedelta(days=1)
BACKOFF = functools.partial(
    shared_outbox.next_attempt,
    first_retry_s=FIRST_RETRY_S, retry_for=RETRY_FOR, factor=BACKOFF_FACTOR, max_wait_s=MAX_RETRY_WAIT_S,
)
# One attempt (opening a conversation, then sending) gives up after this long; its claim holds
# a margin longer, so no other sender takes the delivery while the attempt can still run.
ATTEMPT_TIMEOUT_S = 30.0
LEASE_MARGIN_S = 10.0
# An attempt further down a batch, after slow ones, starts only with this long of its lease to
# spare past its timeout; with less, its lease is renewed first (Sender._hold).
MIN_MARGIN_S = 5.0


class Sender(woken.WokenLoop):
    """The sender of one channel, started and stopped with its leadership (``channels.runner``)."""

    def __init__(self, store: Store, network: Network) -> None:
        super().__init__(store, outbox.wake(network.name))
        self.network = network
        self.name = f"{network.name} sender"

    async def _run(self) -> None:
        while not self._stopping:
            try:
                delay = await self.step()
            except Exception as exc:  # the database went away: log, then look again soon
                logger.error(
                    "%s: %s; trying again in %ss", self.name, type(exc).__name__, RETRY_AFTER_ERROR_S,
                    extra={"action": "channel_send_error"},
                )
                delay = RETRY_AFTER_ERROR_S
            await self._wake.wait(delay)

    async def step(self) -> float:
        """Send every delivery due now; return how many seconds to sleep before the next look."""
        channel = self.network.name
        while not self._stopping:
            now = clock.now()
            lease = now + timedelta(seconds=ATTEMPT_TIMEOUT_S + LEASE_MARGIN_S)
            async with self.store.transaction() as conn:
                claimed = await queries.claim_due(
                    conn, channel=channel, now=clock.format_instant(now), lease=clock.format_instant(lease),
                    limit=CLAIM_BATCH,
                )
            if not claimed:
                break
            for index, delivery in enumerate(claimed):
                # The first is sent as soon as it is claimed; a later one has waited for the sends
                # before it: meanwhile it may have been ended (its identity unlinked from its User),
                # or its lease may be running out (it is renewed first).
                held = await self._hold(delivery) if index else delivery
                if held is None:
                    self._skipped(delivery)
                    continue
                await asyncio.shield(self._attempt(held))
        async with self.store.read() as conn:
            due = await queries.next_due(conn, channel=channel)
            metrics.channel_outbox_depth.labels(channel).set(await queries.depth(conn, channel=channel))
        if due is None:
            return POLL_S
        return max(0.0, min((clock.parse_instant(due) - clock.now()).total_seconds(), POLL_S))

    async def _attempt(self, delivery: queries.Claimed) -> None:
        """Send one claimed delivery and record how it went."""
        error: str | None = None
        try:
            async with asyncio.timeout(ATTEMPT_TIMEOUT_S):
                conversation = delivery.conversation or await self._open(delivery)
                await self.network.send(conversation, delivery.kind, delivery.text, delivery.id)
        except SendFailed as exc:
            error = str(exc)
        except TimeoutError:
            error = f"no answer within {ATTEMPT_TIMEOUT_S:g}s"
        outcome, now = await queries.record(self.store, delivery, error, BACKOFF)
        metrics.channel_messages.labels(self.network.name, "out", outcome).inc()
        if outcome == "delivered":
            latency = (now - clock.parse_instant(delivery.created_at)).total_seconds()
            metrics.channel_delivery_latency.labels(self.network.name).observe(latency)
        logger.log(
            logging.INFO if error is None else logging.WARNING,
            "%s delivery %s (%s) to %s: %s%s", self.network.name, delivery.id, delivery.kind, delivery.identity, outcome,
            "" if error is None else f" after attempt {delivery.attempts}: {error}",
            extra={"action": "channel_delivery", "delivery": delivery.id, "status": outcome},
        )

    async def _hold(self, delivery: queries.Claimed) -> queries.Claimed | None:
        """``delivery``, still open, under a lease that lasts past an attempt begun now: its claim's
        while that has :data:`MIN_MARGIN_S` to spare, else renewed; None when it was ended after it
        was claimed, or its claim ran out and another sender took it (not to be sent from here too).
        With its conversation as it is now: a direct room found shared meanwhile is no longer it."""
        now = clock.now()
        if clock.parse_instant(delivery.lease) - now < timedelta(seconds=ATTEMPT_TIMEOUT_S + MIN_MARGIN_S):
            lease = clock.format_instant(now + timedelta(seconds=ATTEMPT_TIMEOUT_S + LEASE_MARGIN_S))
            renewed = await queries.renew(self.store, delivery, lease=lease)
            if renewed is None:
                return None
            delivery = renewed
        return await queries.still_held(self.store, delivery)

    def _skipped(self, delivery: queries.Claimed) -> None:
        metrics.channel_messages.labels(self.network.name, "out", "superseded").inc()
        logger.info(
            "%s delivery %s (%s) to %s: not sent, it was ended after it was claimed or its claim ran out and "
            "another sender took it", self.network.name, delivery.id, delivery.kind, delivery.identity,
            extra={"action": "channel_delivery", "delivery": delivery.id, "status": "superseded"},
        )

    async def _open(self, delivery: queries.Claimed) -> str:
        """The conversation of a delivery that names none: the User's on this channel if one was
        opened meanwhile, else a new one, recorded before anything is sent into it. Never one
        with an identity the User no longer holds."""
        channel = self.network.name
        async with self.store.read() as conn:
            route = (await queries.routes(conn, [delivery.user_id]) if delivery.user_id else {}).get(delivery.user_id or "")
        if delivery.user_id is not None and (route is None or delivery.identity not in route.identities):
            raise SendFailed(f"{delivery.identity} is no longer linked to the User")
        held = None if route is None else route.private
        # One on an identity since unlinked from the User (written by an attempt under way at the
        # unlink) is none: replaced below. One found shared has no conversation: another is opened
        # in its place, which keeps its seq (the User's last Message came by this channel).
        if held is not None and route is not None and held.identity not in route.identities:
            held = None
        if held is not None and held.conversation is not None and held.channel == channel and held.identity == delivery.identity:
            conversation = held.conversation
        else:
            _, address = identities.parse(delivery.identity)
            conversation = await self.network.open_conversation(address)
            logger.info(
                "%s: opened a conversation with %s", channel, delivery.identity, extra={"action": "channel_open"}
            )
        async with self.store.transaction() as conn:
            await queries.set_delivery_conversation(conn, id=delivery.id, conversation=conversation)
            if delivery.user_id is not None and (held is None or held.conversation is None):
                await queries.set_conversation(conn, queries.Conversation(
                    delivery.user_id, channel, delivery.identity, conversation,
                    None if held is None else held.inbound_seq, clock.now_iso(),
                ))
        return conversation
