"""This process's Message streams: their wake-ups, and their end at shutdown.

A stream waits on its User's channel (``messages.service.channel``), which the
store wakes after every commit that appends to that log: in this process
directly, and from other processes on PostgreSQL through ``LISTEN/NOTIFY``
(the payload names the channel, never a Message; the stream reads the rows).

On SQLite the datagrams of ``store.notifications`` reach only the one process
that runs the loops, so with ``http.workers > 1`` each HTTP process watches the
log table itself: every ``streams.poll_ms`` while it holds a stream, it reads
the largest ``rowid`` of ``messages`` (the end of one B-tree, a page read) and,
when it grew, which Users the new rows belong to, and wakes their streams.
Rows are never deleted, so the rowid only grows.

Nothing runs per stream while it waits: one tick of the Hub, every
``TICKS_PER_KEEP_ALIVE``-th of ``streams.keep_alive_ms`` (at most a second, so
that each tick wakes only a few hundred of 5,000 streams), nudges the streams
whose keep-alive or re-authentication is due (:meth:`Follower.tick`), instead of
a timer per stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Protocol

from agent_gateway.auth import tokens
from agent_gateway.config import Settings
from agent_gateway.messages import service as messages
from agent_gateway.store.engine import Store
from agent_gateway.store.notifications import Subscription

logger = logging.getLogger(__name__)

TICKS_PER_KEEP_ALIVE = 4
MAX_TICK_S = 1.0


class Follower(Protocol):
    """An open stream, as the Hub's tick sees it."""

    def tick(self, now: float, quiet_since: float) -> None:
        """Nudge the stream if it wrote nothing since ``quiet_since`` or a check is due by the next tick (loop times)."""


class Hub:
    """Subscriptions of this process's streams, and the signal that ends them all."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.closed = False
        # Open streams per User: the poller asks only while there are some.
        self._open: Counter[str] = Counter()
        self._subscriptions: dict[Subscription, str] = {}
        self._poller: asyncio.Task[None] | None = None
        # Streams opened with a Token of the password scheme: its digest, checked for
        # all of them in one query per streams.auth_check_ms (not one per stream).
        self._digests: dict[Subscription, str] = {}
        self._token_ended: set[Subscription] = set()
        self._checker: asyncio.Task[None] | None = None
        keep_alive_s = settings.stream_keep_alive_ms / 1000
        self.tick_s = min(keep_alive_s / TICKS_PER_KEEP_ALIVE, MAX_TICK_S)
        # A stream quiet this long gets its keep-alive at this tick: the next would be late.
        self._quiet_s = keep_alive_s - self.tick_s
        self._followers: set[Follower] = set()
        self._ticker: asyncio.Task[None] | None = None

    @property
    def polls(self) -> bool:
        database = self.store.engine.url.database
        on_disk = self.store.dialect == "sqlite" and database not in (None, "", ":memory:")
        return bool(on_disk) and self.settings.http_workers > 1

    def start(self) -> None:
        if self.polls and self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="message stream poller")
        if self._checker is None:
            self._checker = asyncio.create_task(self._check_tokens(), name="message stream Token check")
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="message stream tick")

    def subscribe(self, user_id: str, token_digest: str | None = None) -> Subscription:
        """A wake-up for every commit to ``user_id``'s log from now on; release with :meth:`unsubscribe`.

        With ``token_digest``, the stream is also woken, and :meth:`token_ended` turns
        true, once that Token is revoked or expired.
        """
        subscription = self.store.subscribe(messages.channel(user_id))
        self._subscriptions[subscription] = user_id
        self._open[user_id] += 1
        if token_digest is not None:
            self._digests[subscription] = token_digest
        return subscription

    def follow(self, follower: Follower) -> None:
        """Tick ``follower`` until :meth:`unfollow`."""
        self._followers.add(follower)

    def unfollow(self, follower: Follower) -> None:
        self._followers.discard(follower)

    def token_ended(self, subscription: Subscription) -> bool:
        return subscription in self._token_ended

    def unsubscribe(self, subscription: Subscription) -> None:
        self._digests.pop(subscription, None)
        self._token_ended.discard(subscription)
        user_id = self._subscriptions.pop(subscription)
        self.store.unsubscribe(messages.channel(user_id), subscription)
        self._open[user_id] -= 1
        if not self._open[user_id]:
            del self._open[user_id]

    def __len__(self) -> int:
        return len(self._subscriptions)

    async def close(self) -> None:
        """End every stream (each sends its last bytes and completes its response)."""
        self.closed = True
        for subscription in list(self._subscriptions):
            subscription.wake()
        for task in (self._poller, self._checker, self._ticker):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._poller = self._checker = self._ticker = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_s)
            now = loop.time()
            quiet_since = now - self._quiet_s
            for follower in self._followers:
                follower.tick(now, quiet_since)

    async def _check_tokens(self) -> None:
        interval = self.settings.stream_auth_check_ms / 1000
        while True:
            await asyncio.sleep(interval)
            watched = dict(self._digests)
            if not watched:
                continue
            try:
                live = await tokens.live(self.store, sorted(set(watched.values())))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the next round asks again
                logger.warning("checking streams' Tokens failed (%s)", type(exc).__name__, extra={"action": "stream_check_failed"})
                continue
            for subscription, digest in watched.items():
                if digest not in live and subscription in self._subscriptions:
                    self._token_ended.add(subscription)
                    subscription.wake()

    async def _poll(self) -> None:
        interval = self.settings.stream_poll_ms / 1000
        last: int | None = None
        while True:
            await asyncio.sleep(interval)
            if not self._open:
                last = None  # read afresh when a stream opens: it reads its backlog itself
                continue
            try:
                newest = await messages.last_row(self.store)
                if last is None:
                    # A row written between a stream's own read and this first one would be
                    # missed: every open stream reads once more.
                    woken = list(self._open)
                elif newest > last:
                    woken = await messages.writers_since(self.store, last)
                else:
                    woken = []
                last = newest
                for user_id in woken:
                    if user_id in self._open:
                        self.store.notifier.publish(messages.channel(user_id))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: streams re-read on their own timer
                logger.warning("message stream poll failed (%s)", type(exc).__name__, extra={"action": "stream_poll_failed"})
