"""GET /users/me under NIP-98 against a bearer Token, in alternating rounds (issue 37).

    python -m bench.nip98 --backend sqlite
    python -m bench.nip98 --backend postgresql

Each round sends REQUESTS requests over CONNECTIONS keep-alive connections
(httpx), first with the bearer Token, then with NIP-98 headers, and so on
alternately. The NIP-98 events are signed before the round (a fresh event per
request: the replay check refuses a repeated one), so the round measures the
server: a Schnorr verification, the identity lookup and the replay row.
Target: NIP-98 >= 0.7x the bearer Token's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time

import httpx
import nostr_sdk

from agent_gateway import clock
from agent_gateway.auth import service as auth_service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.users import service as users_service
from bench import harness

CONNECTIONS = 16
REQUESTS = 2000
TTL_MS = 3_600_000


async def _user(database_url: str, keys: nostr_sdk.Keys) -> str:
    store = Store(database_url)
    try:
        async with store.transaction() as conn:
            user = await users_service.admit(conn)
            await channel_queries.link(conn, identity=f"nostr:{keys.public_key().to_hex()}", channel="nostr",
                                       user_id=user.id, created_at=clock.now_iso())
            return (await auth_service.issue_token(conn, user.id, ttl_ms=TTL_MS)).token
    finally:
        await store.close()


def _nostr_headers(keys: nostr_sdk.Keys, url: str, count: int) -> list[dict[str, str]]:
    now = nostr_sdk.Timestamp.from_secs(int(time.time()))
    headers = []
    for nonce in range(count):
        tags = [nostr_sdk.Tag.parse(tag) for tag in (["u", url], ["method", "GET"], ["nonce", str(nonce)])]
        event = nostr_sdk.EventBuilder(nostr_sdk.Kind(27235), "").tags(tags).custom_created_at(now).finalize(keys)
        headers.append({"Authorization": "Nostr " + base64.b64encode(event.as_json().encode()).decode()})
    return headers


async def _round(url: str, headers: list[dict[str, str]]) -> float:
    """Requests per second of one round; every answer must be 200."""
    queue = list(reversed(headers))

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            response = await http.get(url, headers=queue.pop())
            assert response.status_code == 200, response.text

    limits = httpx.Limits(max_connections=CONNECTIONS)
    async with httpx.AsyncClient(limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(CONNECTIONS)))
        return len(headers) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    args = parser.parse_args()

    keys = nostr_sdk.Keys.generate()
    env = {"AGENT_GATEWAY_AUTH_SCHEMES": '["password", "nostr"]'}
    with harness.gateway(args.backend, env) as served:
        token = asyncio.run(_user(served.env["AGENT_GATEWAY_DATABASE_URL"], keys))
        url = served.public_url + "/users/me"
        bearer, nostr = [], []
        for _ in range(args.rounds):
            bearer.append(asyncio.run(_round(url, [{"Authorization": f"Bearer {token}"}] * REQUESTS)))
            nostr.append(asyncio.run(_round(url, _nostr_headers(keys, url, REQUESTS))))
    b, n = statistics.median(bearer), statistics.median(nostr)
    print(f"backend {args.backend}, {args.rounds} alternating rounds of {REQUESTS} requests, {CONNECTIONS} connections (httpx)")
    print(f"GET /users/me bearer Token: {b:,.0f} req/s (median; rounds {', '.join(f'{x:,.0f}' for x in bearer)})")
    print(f"GET /users/me NIP-98:       {n:,.0f} req/s (median; rounds {', '.join(f'{x:,.0f}' for x in nostr)})")
    print(f"NIP-98 / bearer: {n / b:.2f}x (target >= 0.7x)")


if __name__ == "__main__":
    main()
