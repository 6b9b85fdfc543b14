"""What ops.observe counts: the same numbers prometheus_client's own counter and histogram would hold."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from starlette.types import Receive, Scope, Send

from agent_gateway.ops import metrics, observe

from tests.ops.conftest import value

# Durations on both sides of bucket bounds, one on a bound ("less than or equal"), one past them all.
DURATIONS = [0.0004, 0.001, 0.003, 0.003, 0.2, 7.0, 42.0]


async def answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def ignore(message: object) -> None:
    pass


def clock(durations: list[float]) -> Iterator[float]:
    """perf_counter for ``observe``: each request starts at 0 and ends after its duration (exactly)."""
    for duration in durations:
        yield 0.0
        yield duration


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"server": "probe", "route": "/users/me", "method": "GET", **labels}) or 0.0


def test_counts_wait_for_a_flush_and_then_equal_what_observe_would_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = clock(DURATIONS)
    monkeypatch.setattr(observe.time, "perf_counter", lambda: next(ticks))
    observed = observe.Observed(answer, "probe", fast_routes=[("GET", "/users/me")], count=True, access_log=False)
    buckets = [*(str(bound) for bound in metrics.REQUEST_BUCKETS), "+Inf"]
    before = {bound: sample("agent_gateway_http_request_duration_seconds_bucket", le=bound) for bound in buckets}
    count_before = sample("agent_gateway_http_requests_total", status="204")
    sum_before = sample("agent_gateway_http_request_duration_seconds_sum")

    async def requests() -> None:
        for _ in DURATIONS:
            await observed({"type": "http", "method": "GET", "path": "/users/me"}, None, ignore)  # type: ignore[arg-type]

    asyncio.run(requests())
    assert sample("agent_gateway_http_requests_total", status="204") == count_before  # not yet flushed
    observed.flush()
    assert sample("agent_gateway_http_requests_total", status="204") == count_before + len(DURATIONS)
    assert sample("agent_gateway_http_request_duration_seconds_sum") == pytest.approx(sum_before + sum(DURATIONS))
    for bound in buckets:
        expected = sum(1 for duration in DURATIONS if bound == "+Inf" or duration <= float(bound))
        moved = sample("agent_gateway_http_request_duration_seconds_bucket", le=bound) - before[bound]
        assert moved == expected, bound
    observed.flush()  # nothing new: nothing moves
    assert sample("agent_gateway_http_requests_total", status="204") == count_before + len(DURATIONS)


POOLS = """
import os, sys
from agent_gateway.ops import metrics

metrics.use_directory(sys.argv[1])
metrics.pool_usage(1, 0)
for in_use, waiting, leaves in ((2, 1, False), (4, 5, True)):
    child = os.fork()
    if child == 0:
        metrics.pool_usage(in_use, waiting)
        if leaves:
            metrics.leave()
        os._exit(0)
    os.waitpid(child, 0)
sys.stdout.buffer.write(metrics.exposition(metrics.Sampled(lambda: None)))
"""


def test_with_several_processes_the_pool_gauges_sum_the_live_ones(tmp_path: Path) -> None:
    """Each HTTP process has its own pool: /metrics adds up those still serving."""
    shown = subprocess.run([sys.executable, "-c", POOLS, str(tmp_path)], capture_output=True, check=True, timeout=300)
    text = shown.stdout.decode()
    assert value(text, "agent_gateway_db_pool_connections_in_use") == 1 + 2
    assert value(text, "agent_gateway_db_pool_waiting") == 0 + 1
