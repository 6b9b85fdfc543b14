"""Password login and the authenticated path, on a real gateway at the default scrypt cost.

    python -m bench.auth --backend sqlite
    python -m bench.auth --backend postgresql

Prints three measurements (wrk -t1 -c16 -d10s on loopback):

1. ``POST /auth/tokens`` throughput at the default cost (2^15 x 8 x 1): the
   target is the cores saturated, about cores / one derivation (~200 ms).
2. ``GET /users/me`` throughput with a bearer Token: target >= 4,500 req/s.
3. ``GET /users/me`` again while 8 more clients log in continuously: its p99
   should stay <= 50 ms, since derivations run off the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading

from agent_gateway.auth import service as auth_service
from agent_gateway.config import ScryptCost
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness

PASSWORD = "benchmark password"
LOGIN_CLIENTS = 8
OTHER_USERS = 1000
TTL_MS = 3_600_000


async def _users(database_url: str) -> tuple[dict, str]:
    """One User with a password and a Token, among others holding Tokens of their own."""
    store = Store(database_url)
    try:
        async with store.transaction() as conn:
            for _ in range(OTHER_USERS):
                other = await users_service.admit(conn)
                await auth_service.issue_token(conn, other.id, ttl_ms=TTL_MS)
            user = await users_service.admit(conn)
            await auth_service.set_password(conn, user.id, PASSWORD, cost=ScryptCost())
            issued = await auth_service.issue_token(conn, user.id, ttl_ms=TTL_MS)
    finally:
        await store.close()
    return user.to_json(), issued.token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--workers", type=int, default=1, help="HTTP processes (http.workers)")
    args = parser.parse_args()

    # ServedGateway lowers the cost for tests; the benchmark measures the default one.
    env = {"AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "15", "AGENT_GATEWAY_AUTH_SCRYPT_BLOCKSIZE": "8", harness.WORKERS: str(args.workers)}
    with harness.gateway(args.backend, env) as served:
        user, token = asyncio.run(_users(served.env["AGENT_GATEWAY_DATABASE_URL"]))
        pid = served.process.pid
        idle = harness.rss_mb(pid)

        login = harness.lua_request("POST", {"user": user["id"], "password": PASSWORD})
        me = harness.lua_request("GET", headers={"Authorization": f"Bearer {token}"})
        tokens_url, me_url = served.public_url + "/auth/tokens", served.public_url + "/users/me"

        logins = harness.wrk(tokens_url, login, duration_s=args.duration)
        after_logins = harness.rss_mb(pid)
        reads = harness.wrk(me_url, me, duration_s=args.duration)

        # Logins run for the whole read measurement, starting a little before it.
        background: dict[str, harness.WrkResult] = {}
        logging_in = threading.Thread(
            target=lambda: background.setdefault(
                "logins",
                harness.wrk(tokens_url, login, duration_s=args.duration + 2, connections=LOGIN_CLIENTS),
            )
        )
        logging_in.start()
        threading.Event().wait(1)
        mixed = harness.wrk(me_url, me, duration_s=args.duration)
        logging_in.join()
        loaded = harness.rss_mb(pid)

    print(f"backend {args.backend}, {len(os.sched_getaffinity(0))} cores, {args.workers} HTTP process(es), scrypt 2^15 x 8 x 1, wrk -t1 -c16 -d{args.duration}s")
    print(logins.line("POST /auth/tokens"))
    print(reads.line("GET /users/me"))
    print(mixed.line(f"GET /users/me, {LOGIN_CLIENTS} clients logging in"))
    print(background["logins"].line(f"  (POST /auth/tokens meanwhile, -c{LOGIN_CLIENTS})"))
    print(f"resident memory: idle {idle:.0f} MB, after logins {after_logins:.0f} MB, at the end {loaded:.0f} MB")


if __name__ == "__main__":
    main()
