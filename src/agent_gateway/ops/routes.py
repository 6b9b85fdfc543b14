"""The ops listener's routes: ``/healthz``, ``/readyz``, ``/metrics`` (never on the spec's two servers)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from agent_gateway.http.app import create_app
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import json_response
from agent_gateway.ops import metrics, readiness
from agent_gateway.ops.view import GatewayView
from agent_gateway.signals import service as signals
from agent_gateway.store.queries import signals as signal_queries

logger = logging.getLogger(__name__)

# The Signals gauge reads the database at most this often, however often it is scraped.
SIGNALS_CACHE_S = 5.0
OPS_BODY_LIMIT = 1024
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

ops = new_router()


@ops.get("/healthz", summary="200 while the process serves")
async def healthz() -> Any:
    return json_response({"status": "ok"})


@ops.get("/readyz", summary="200 when this process can do its work; 503 naming what is not ready")
async def readyz(request: Request) -> Any:
    gateway: GatewayView = request.app.state.gateway
    checks = await readiness.check(gateway)
    ready = all(outcome == readiness.OK for outcome in checks.values())
    body: dict[str, Any] = {"status": "ready" if ready else "not ready", "checks": checks}
    # A chat channel that cannot reach its server is shown, and does not make this process unready:
    # its HTTP servers and loops still work, and a restart would not bring the homeserver back.
    channels = gateway.channels_status()
    if channels:
        body["channels"] = channels
    return json_response(body, 200 if ready else 503)


@ops.get("/metrics", summary="Prometheus text exposition")
async def metrics_text(request: Request) -> Any:
    gateway: GatewayView = request.app.state.gateway
    sampled = gateway.sampled
    if time.monotonic() - sampled.signals_at >= SIGNALS_CACHE_S:
        try:
            async with asyncio.timeout(readiness.CHECK_TIMEOUT_S):
                async with gateway.store.read() as conn:
                    sampled.set_signals(
                        await signal_queries.count_by_state(conn), await signals.count_cancelled(conn)
                    )
        except Exception as exc:  # the other metrics still matter; the gauge keeps its last values
            logger.warning(
                "cannot count Signals for /metrics: %s", type(exc).__name__, extra={"action": "metrics_signals"}
            )
    gateway.flush_metrics()  # this process's requests, up to this one
    return Response(metrics.exposition(sampled), media_type=PROMETHEUS_TEXT)


def create(gateway: GatewayView) -> FastAPI:
    app = create_app("agent-gateway: ops listener", "Health, readiness and Prometheus metrics.", [ops], OPS_BODY_LIMIT)
    app.state.gateway = gateway
    return app
