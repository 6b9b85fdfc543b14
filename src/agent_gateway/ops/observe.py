"""What each answered request leaves behind: Prometheus counts and, when on, an access-log line.

:class:`Observed` wraps a server's whole app (the fast path included, so its
answers count like the routes'). It labels a request by its route template
(``/decisions/{seq}``), never its path, and logs server, method, route,
status, duration and bytes: never a query value, a header, a body or a Token.

Counting is a cost of every request, so a request adds into plain numbers
kept here (a :class:`_Series` per label set) rather than into
prometheus_client's values, which take a lock per increment (about 2.5 µs of
the request, twice what the rest of the counting costs). :meth:`Observed.flush`
moves them into the metrics: at every scrape, at stop, and once a second
(``FLUSH_INTERVAL_S``), which is what the forked HTTP processes, never scraped
themselves, rely on.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Collection

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.ops import metrics
from agent_gateway.ops.logs import ACCESS_LOGGER

access_logger = logging.getLogger(ACCESS_LOGGER)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The label of a request no route matched (404, 405): paths are unbounded, this is not.
UNMATCHED = "unmatched"
# How often each process moves its counts into the metrics (a scrape also does, in its process).
FLUSH_INTERVAL_S = 1.0


class _Series:
    """The counts of one label set since the last flush, and the metrics they go to."""

    __slots__ = ("count", "seconds", "buckets", "counter", "histogram")

    def __init__(self, counter: Counter, histogram: Histogram) -> None:
        self.count = 0
        self.seconds = 0.0
        # One per bucket bound, and the last for +Inf, as prometheus_client's histogram.
        self.buckets = [0] * (len(metrics.REQUEST_BUCKETS) + 1)
        self.counter = counter
        self.histogram = histogram

    def flush(self) -> None:
        if not self.count:
            return
        self.counter.inc(self.count)
        # prometheus_client has no bulk observe; its histogram child keeps a value per bucket
        # (``_buckets``, not cumulative) and ``_sum``, as observe() adds to them. Pinned in
        # constraints.txt; tests/ops compare every bucket with the requests made.
        self.histogram._sum.inc(self.seconds)
        for value, count in zip(self.histogram._buckets, self.buckets):
            if count:
                value.inc(count)
        self.count, self.seconds = 0, 0.0
        self.buckets = [0] * len(self.buckets)


class Observed:
    """Counts (``count``) and logs (``access_log``) every request ``app`` answers, as ``server``.

    ``fast_routes`` are the (method, path) pairs the fast path answers by their exact path (the
    gateway gives ``FastPath.routes``): such a path is its own template (the fast path leaves a
    templated route in ``scope["route"]``, as FastAPI does, so it need not be given).
    """

    def __init__(
        self, app: ASGIApp, server: str, *, fast_routes: Collection[tuple[str, str]] = (), count: bool, access_log: bool
    ) -> None:
        self.app = app
        self.server = server
        self.fast_paths = {path for _, path in fast_routes}
        self.count = count
        self.access_log = access_log
        # Bounded like the labels: route templates x METHODS and OTHER x statuses.
        self._series: dict[tuple[str, str, int], _Series] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering (connections.guard)
        sent = 0

        async def observed_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self._record(scope, status, sent, time.perf_counter() - started)

    def _record(self, scope: Scope, status: int, sent: int, elapsed: float) -> None:
        route = self.route(scope)
        method = scope["method"]
        if method not in METHODS:
            method = "OTHER"
        if self.count:
            series = self._series.get((route, method, status))
            if series is None:
                series = self._series[route, method, status] = _Series(
                    metrics.http_requests.labels(self.server, route, method, str(status)),
                    metrics.http_request_duration.labels(self.server, route, method),
                )
            series.count += 1
            series.seconds += elapsed
            # The first bound at or above: prometheus buckets are "less than or equal".
            series.buckets[bisect.bisect_left(metrics.REQUEST_BUCKETS, elapsed)] += 1
        if self.access_log:
            duration_ms = round(elapsed * 1000, 3)
            access_logger.info(
                "%s %s %s %d %dB %.3fms",
                self.server, method, route, status, sent, duration_ms,
                extra={
                    "action": "request", "server": self.server, "method": method, "route": route,
                    "status": status, "duration_ms": duration_ms, "bytes": sent,
                },
            )

    def flush(self) -> None:
        """Move the counts of every request answered so far into the metrics."""
        for series in list(self._series.values()):
            series.flush()

    def route(self, scope: Scope) -> str:
        """The template of the route that answered: FastAPI's (it sets ``scope["route"]``), or the fast path's."""
        matched = scope.get("route")
        if matched is not None:
            return getattr(matched, "path_format", None) or getattr(matched, "path", UNMATCHED)
        return scope["path"] if scope["path"] in self.fast_paths else UNMATCHED
