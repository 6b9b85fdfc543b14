"""What each answered request leaves behind: Prometheus counts and, when on, an access-log line.

:class:`Observed` wraps a server's whole app (the fast path included, so its
answers count like the routes'). It labels a request by its route template
(``/decisions/{seq}``), never its path, and logs server, method, route,
status, duration and bytes: never a query value, a header, a body or a Token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.ops import metrics
from agent_gateway.ops.logs import ACCESS_LOGGER

access_logger = logging.getLogger(ACCESS_LOGGER)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The label of a request no route matched (404, 405): paths are unbounded, this is not.
UNMATCHED = "unmatched"


class Observed:
    """Counts (``count``) and logs (``access_log``) every request ``app`` answers, as ``server``.

    ``fast_routes`` are the (method, path) pairs the fast path answers: their path is their template.
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
        self._series: dict[tuple[str, str, int], tuple[Callable[[], None], Callable[[float], None]]] = {}

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
                series = self._series[route, method, status] = self._new_series(route, method, status)
            count, observe = series
            count()
            observe(elapsed)
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

    def _new_series(self, route: str, method: str, status: int) -> tuple[Callable[[], None], Callable[[float], None]]:
        """The counter's and the histogram's children of one label set, looked up once: ``labels()``
        costs more than counting."""
        counter = metrics.http_requests.labels(self.server, route, method, str(status))
        histogram = metrics.http_request_duration.labels(self.server, route, method)
        return counter.inc, histogram.observe

    def route(self, scope: Scope) -> str:
        """The template of the route that answered: FastAPI's (it sets ``scope["route"]``), or the fast path's."""
        matched = scope.get("route")
        if matched is not None:
            return getattr(matched, "path_format", None) or getattr(matched, "path", UNMATCHED)
        return scope["path"] if scope["path"] in self.fast_paths else UNMATCHED
