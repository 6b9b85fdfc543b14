"""Scheduler benchmark: fire lateness and ``PUT /schedules/{name}`` throughput, on a real gateway.

    python -m bench.scheduler --backend sqlite
    python -m bench.scheduler --backend postgresql --burst 1000 --stream 200

Lateness is ``firedAt - scheduledFor`` of each ``service_schedule_fired``
Signal (millisecond resolution). Targets: p99 <= 20 ms for a steady stream;
all of a burst of 1,000 Schedules due at the same second fired within 2 s.
Schedules are armed through the operator's Python API in one transaction from
this process; the running gateway's timer is woken across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import datetime, timedelta

import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.scheduler import service
from agent_gateway.store.engine import Store
from agent_gateway.store.tables import signals
from bench import harness

PUT_LUA = """
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("PUT", "/schedules/bench-" .. counter, {["Content-Type"] = "application/json"},
    '{"spec": {"kind": "once", "at": "2099-01-01T00:00:00Z"}, "data": {"n": ' .. counter .. '}}')
end
"""
# Everything is armed this far ahead, so arming is over before the first fire.
LEAD_S = 3.0


async def arm(url: str, prefix: str, instants: list[datetime]) -> None:
    store = Store(url)
    try:
        async with store.transaction() as conn:
            for index, at in enumerate(instants):
                spec = {"kind": "once", "at": clock.format_instant(at)}
                await service.put(conn, f"{prefix}-{index:05d}", spec, data={"index": index})
    finally:
        await store.close()


async def lateness_ms(url: str, prefix: str, count: int, timeout_s: float) -> list[float]:
    """Wait for ``count`` fires of Schedules named ``prefix-*``; their lateness in ms."""
    store = Store(url)
    query = sa.select(signals.c.payload).where(signals.c.kind == service.FIRED_KIND)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            async with store.read() as conn:
                payloads = [row.payload for row in await conn.execute(query)]
            mine = [p for p in payloads if p["scheduleName"].startswith(prefix + "-")]
            if len(mine) >= count or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await store.close()
    if len(mine) < count:
        print(f"  only {len(mine)} of {count} fired within {timeout_s:.0f} s")
    return sorted(
        (clock.parse_instant(p["firedAt"]) - clock.parse_instant(p["scheduledFor"])) / timedelta(milliseconds=1)
        for p in mine
    )


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def report(label: str, late: list[float]) -> None:
    if not late:
        print(f"{label}: nothing fired")
        return
    print(
        f"{label}: {len(late)} fires, lateness p50 {percentile(late, 0.5):.0f} ms  p90 {percentile(late, 0.9):.0f} ms  "
        f"p99 {percentile(late, 0.99):.0f} ms  max {late[-1]:.0f} ms  mean {statistics.fmean(late):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--stream", type=int, default=200, help="Schedules in the steady stream")
    parser.add_argument("--interval-ms", type=int, default=25, help="spacing of the steady stream")
    parser.add_argument("--burst", type=int, default=1000, help="Schedules due at the same second")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S, help="seconds of PUT load")
    args = parser.parse_args()

    with harness.gateway(args.backend) as served:
        url = served.env["AGENT_GATEWAY_DATABASE_URL"]
        print(f"backend {args.backend}")

        start = clock.now() + timedelta(seconds=LEAD_S)
        stream = [start + timedelta(milliseconds=args.interval_ms * i) for i in range(args.stream)]
        asyncio.run(arm(url, "stream", stream))
        span_s = args.stream * args.interval_ms / 1000
        report(
            f"steady stream ({1000 / args.interval_ms:.0f}/s)",
            asyncio.run(lateness_ms(url, "stream", args.stream, LEAD_S + span_s + 30)),
        )

        due = (clock.now() + timedelta(seconds=LEAD_S + 1)).replace(microsecond=0)
        asyncio.run(arm(url, "burst", [due] * args.burst))
        late = asyncio.run(lateness_ms(url, "burst", args.burst, LEAD_S + 60))
        report(f"burst ({args.burst} due at {clock.format_instant(due)})", late)
        if late:
            print(f"  all fired within {late[-1] / 1000:.2f} s of the due second (target 2 s)")

        pid = served.process.pid
        result = harness.wrk(served.agent_url + "/schedules/x", PUT_LUA, duration_s=args.duration)
        print(result.line("PUT /schedules/{name} (new names)"))
        print(f"resident memory after load: {harness.rss_mb(pid):.0f} MB")


if __name__ == "__main__":
    main()
