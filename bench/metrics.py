"""The cost of counting: ``GET /users/me`` and ``POST /decisions`` with metrics on and off.

    python -m bench.metrics --backend sqlite
    python -m bench.metrics --backend postgresql --rounds 9

Metrics (and the middleware that counts every request) are on with an ops
listener and off with ``ops.listen = ""``; the access log stays off in both
(text format). Both gateways run side by side (one idles while the other is
measured), wrk -t1 -c16 on loopback, in rounds whose order alternates
(off, on, then on, off, ...): the load of a shared machine drifts over
minutes, and whichever runs second in a pair tends to lose, so each mode goes
first as often as the other. The medians are compared. Target of issue 16:
on within 5 % of off.

Throughput on two shared cores varies by more than 5 % from round to round, so
each round also reads the server process's CPU time (``/proc/PID/stat``) and
prints the CPU it spent per request: one process serves on one core, so its
throughput is the inverse of that, and CPU time barely moves with what else the
machine does, though on a shared machine not by nothing.

Last, the steadiest figure: two in-process gateways (metrics off, on) answer
``GET /users/me`` handed straight to their ASGI apps, 16 at a time, in
alternating blocks, and the CPU time of the best block of each is compared.
Interference only ever adds to a block, so the best blocks are the costs
themselves. (Not ``POST /decisions``: how many publishes share a commit varies
from block to block, and with it the CPU of a block, by ±15 % in an A/A run.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.types import ASGIApp, Message

from agent_gateway import config
from agent_gateway.auth import service as auth_service
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness

STATEMENT = "The release of 2026-11-21 is approved; rollback plan attached as item 4."
TTL_MS = 3_600_000
MODES = {"off": {"AGENT_GATEWAY_OPS_LISTEN": ""}, "on": {}}
ROUTES = ("GET /users/me", "POST /decisions")
# Concurrent clients, in process as through the socket (wrk -c16).
CLIENTS = 16


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


async def _disconnect() -> Message:
    return {"type": "http.disconnect"}


async def _ignore(message: Message) -> None:
    pass


def _call(app: ASGIApp, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Callable[[], Awaitable[None]]:
    """One request straight into ``app``, as uvicorn would hand it over (less the HTTP parsing)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"bench"), *headers],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8700),
    }
    request = {"type": "http.request", "body": b"", "more_body": False}

    async def call() -> None:
        received = False

        async def receive() -> Message:
            nonlocal received
            if received:
                return await _disconnect()
            received = True
            return request

        await app(dict(scope), receive, _ignore)

    return call


async def _client(call: Callable[[], Awaitable[None]], requests: int) -> None:
    for _ in range(requests):
        await call()


async def _in_process(databases: dict[str, tuple[str, Path]], requests: int, blocks: int, control: bool) -> dict[str, float]:
    """CPU microseconds per ``GET /users/me`` of each mode through a whole in-process gateway (its
    fast path, the Token's check in the database: ``databases`` gives each mode's URL and folder),
    the best of ``blocks`` alternating blocks.

    CPU time (``time.process_time``, every thread of this process) of requests made by
    ``CLIENTS`` concurrent clients, as wrk's connections: what else the machine does can only
    add to a block, so the best block is the cost. uvicorn's HTTP parsing is left out; it is
    the same with metrics on and off, so the ratio here is an upper bound on the ratio through
    a socket.
    """
    calls: dict[str, Callable[[], Awaitable[None]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for mode, (url, directory) in databases.items():
            key_file = directory / "signing-key.pem"
            keys.write_private(key_file, keys.generate_pem("ed25519"))
            settings = config.Settings(
                token_ttl_ms=TTL_MS, database_url=url, signing_key_file=key_file, runtime_workdir=directory,
                ops_listen=None if mode == "off" or control else config.Address("127.0.0.1", 0), log_access=False,
            )
            gateway = Gateway(settings, roles=frozenset({"api"}))
            await gateway.start()
            stack.push_async_callback(gateway.stop)
            token = await _token(url)
            calls[mode] = _call(gateway.public_asgi, "GET", "/users/me", [(b"authorization", f"Bearer {token}".encode())])
        best: dict[str, float] = {}
        for number in range(blocks):
            for mode in list(MODES) if number % 2 == 0 else list(reversed(MODES)):
                started = time.process_time()
                await asyncio.gather(*(_client(calls[mode], requests // CLIENTS) for _ in range(CLIENTS)))
                spent = (time.process_time() - started) / requests * 1e6
                best[mode] = min(best.get(mode, spent), spent)
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=8000, help="requests per in-process block")
    parser.add_argument(
        "--control", action="store_true", help='metrics off in both gateways (an A/A run: the noise floor of "on/off")'
    )
    args = parser.parse_args()

    throughput: dict[tuple[str, str], list[float]] = {}
    cpu_us: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        clients, pids = {}, {}
        for mode, env in MODES.items():
            served = stack.enter_context(harness.gateway(args.backend, MODES["off"] if args.control else env))
            assert (served.ops_url is None) == (mode == "off" or args.control)
            clients[mode], pids[mode] = _clients(served), served.process.pid
        for number in range(args.rounds):
            order = list(MODES) if number % 2 == 0 else list(reversed(MODES))
            for route in ROUTES:
                for mode in order:
                    url, lua = clients[mode][route]
                    result, per_request = harness.wrk_cpu(pids[mode], url, lua, duration_s=args.duration)
                    print(
                        result.line(f"round {number + 1}, metrics {mode:<3} {route}") + f"   {per_request:5.0f} us CPU/req",
                        flush=True,
                    )
                    throughput.setdefault((mode, route), []).append(result.requests_per_s)
                    cpu_us.setdefault((mode, route), []).append(per_request)
    print(
        f"backend {args.backend}, {len(os.sched_getaffinity(0))} cores, medians of {args.rounds} rounds in alternating "
        f"order, wrk -t1 -c16 -d{args.duration}s"
    )
    with contextlib.ExitStack() as stack:
        databases = {}
        for mode in MODES:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agw-bench-")))
            databases[mode] = stack.enter_context(harness.database(args.backend, directory)), directory
        best = asyncio.run(_in_process(databases, args.requests, args.rounds, args.control))
    for route in ROUTES:
        off, on = statistics.median(throughput["off", route]), statistics.median(throughput["on", route])
        cpu_off, cpu_on = statistics.median(cpu_us["off", route]), statistics.median(cpu_us["on", route])
        print(
            f"{route:<16} through the socket: off {off:>7,.0f} req/s   on {on:>7,.0f} req/s   on/off {on / off:6.1%};   "
            f"server CPU/request off {cpu_off:4.0f} us   on {cpu_on:4.0f} us   off/on {cpu_off / cpu_on:6.1%}"
        )
    off, on = best["off"], best["on"]
    print(
        f"GET /users/me    in process, best of {args.rounds} blocks of {args.requests:,}: CPU/request off {off:5.1f} us   "
        f"on {on:5.1f} us   off/on {off / on:6.1%}   (metrics add {on - off:4.1f} us)"
    )


if __name__ == "__main__":
    main()
