"""The cost of counting: ``GET /users/me`` and ``POST /decisions`` with metrics on and off.

    python -m bench.metrics --backend sqlite
    python -m bench.metrics --backend postgresql --rounds 3

Metrics (and the middleware that counts every request) are on with an ops
listener and off with ``ops.listen = ""``; the access log stays off in both
(text format). Both gateways run side by side (one idles while the other is
measured) and the rounds alternate off, on, off, on... (wrk -t1 -c16 on
loopback), so that the load of a shared machine, which drifts over minutes,
weighs on both alike; the median of each is compared. Target of issue 16: on
within 5 % of off.

On a busy shared machine rounds vary by more than 5 %, so it also times what
metrics add to one request in process (``ops.observe.Observed`` around an app
that answers at once) and prints the throughput that cost alone would leave of
each median "off" figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from agent_gateway.auth import service as auth_service
from agent_gateway.ops.observe import Observed
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness

STATEMENT = "The release of 2026-11-21 is approved; rollback plan attached as item 4."
TTL_MS = 3_600_000
MODES = {"off": {"AGENT_GATEWAY_OPS_LISTEN": ""}, "on": {}}
ROUTES = ("GET /users/me", "POST /decisions")


async def _token(database_url: str) -> str:
    store = Store(database_url)
    try:
        async with store.transaction() as conn:
            user = await users_service.admit(conn)
            return (await auth_service.issue_token(conn, user.id, ttl_ms=TTL_MS)).token
    finally:
        await store.close()


def _clients(served: harness.ServedGateway) -> dict[str, tuple[str, str]]:
    """Each measured route: (URL, wrk script)."""
    token = asyncio.run(_token(served.env["AGENT_GATEWAY_DATABASE_URL"]))
    return {
        "GET /users/me": (
            served.public_url + "/users/me",
            harness.lua_request("GET", headers={"Authorization": f"Bearer {token}"}),
        ),
        "POST /decisions": (served.agent_url + "/decisions", harness.lua_request("POST", {"statement": STATEMENT})),
    }


async def _answer(scope: dict, receive: object, send: Callable[[dict], Awaitable[None]]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _ignore(message: dict) -> None:
    pass


def added_cost_us(requests: int = 200_000) -> float:
    """Microseconds metrics add to one request (best of three runs), in process."""

    async def timed(app: Callable[..., Awaitable[None]]) -> float:
        scope = {"type": "http", "method": "GET", "path": "/users/me"}
        started = time.perf_counter()
        for _ in range(requests):
            await app(dict(scope), None, _ignore)
        return (time.perf_counter() - started) / requests * 1e6

    observed = Observed(_answer, "public", fast_routes=[("GET", "/users/me")], count=True, access_log=False)
    bare = min(asyncio.run(timed(_answer)) for _ in range(3))
    return min(asyncio.run(timed(observed)) for _ in range(3)) - bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    measured: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        clients = {}
        for mode, env in MODES.items():
            served = stack.enter_context(harness.gateway(args.backend, env))
            assert (served.ops_url is None) == (mode == "off")
            clients[mode] = _clients(served)
        for number in range(args.rounds):
            for route in ROUTES:
                for mode in MODES:
                    url, lua = clients[mode][route]
                    result = harness.wrk(url, lua, duration_s=args.duration)
                    print(result.line(f"round {number + 1}, metrics {mode:<3} {route}"), flush=True)
                    measured.setdefault((mode, route), []).append(result.requests_per_s)
    print(
        f"backend {args.backend}, {len(os.sched_getaffinity(0))} cores, median of {args.rounds} alternating rounds, "
        f"wrk -t1 -c16 -d{args.duration}s"
    )
    cost = added_cost_us()
    for route in ROUTES:
        off, on = statistics.median(measured["off", route]), statistics.median(measured["on", route])
        # One process serves on one core: each request's time grows by the added cost.
        estimate = 1 / (1 + cost * off / 1e6)
        print(
            f"{route:<16} off {off:>9,.0f} req/s   on {on:>9,.0f} req/s   on/off {on / off:6.1%}   "
            f"(in-process cost {cost:.1f} us/request: {estimate:6.1%} of off)"
        )


if __name__ == "__main__":
    main()
