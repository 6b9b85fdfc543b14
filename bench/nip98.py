"""GET /users/me under NIP-98 against a bearer Token, in alternating rounds (issue 37).

    python -m bench.nip98 --backend sqlite
    python -m bench.nip98 --backend postgresql

Each round is ``wrk -t1 -c16`` for ROUND_S seconds (bench.harness), first with
the bearer Token, then with NIP-98 headers, and so on alternately; besides the
requests per second, the gateway's CPU per request (which the machine's other
load moves far less). A NIP-98 request carries its own event (the replay check
refuses a repeated one): the events are signed before the round, with a
created_at 30 s ahead so that all of them are within the 60 s window while
they are sent, and the wrk script hands out one per request. Every answer must
be 200 (a round that ran out of events says so). Target: NIP-98 >= 0.7x the
bearer Token's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time

import nostr_sdk

from agent_gateway import clock
from agent_gateway.auth import service as auth_service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.users import service as users_service
from bench import harness

ROUND_S = 5
# Signed events per NIP-98 round: more than the gateway answers in ROUND_S on this kind of machine
# (as many as a bearer round's requests, about 15,000 a second on SQLite).
EVENTS = 80_000
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


def _nostr_script(keys: nostr_sdk.Keys, url: str) -> str:
    """A wrk script sending EVENTS requests, each with an event of its own."""
    ahead = nostr_sdk.Timestamp.from_secs(int(time.time()) + 30)
    headers = []
    for nonce in range(EVENTS):
        tags = [nostr_sdk.Tag.parse(tag) for tag in (["u", url], ["method", "GET"], ["nonce", str(nonce)])]
        event = nostr_sdk.EventBuilder(nostr_sdk.Kind(27235), "").tags(tags).custom_created_at(ahead).finalize(keys)
        headers.append('"Nostr ' + base64.b64encode(event.as_json().encode()).decode() + '"')
    return (
        "local headers = {" + ",\n".join(headers) + "}\n"
        "local sent = 0\n"
        "request = function()\n"
        "  sent = sent + 1\n"
        '  return wrk.format("GET", nil, {["Authorization"] = headers[sent]})\n'
        "end\n"
    )


def _round(served, url: str, lua: str) -> tuple[float, float]:
    """Requests per second and CPU microseconds per request of one round; every answer must be 200."""
    result, cpu_us = harness.wrk_cpu(served.process.pid, url, lua, duration_s=ROUND_S)
    if result.non_2xx or result.errors:
        raise SystemExit(f"a round had {result.non_2xx} answers other than 200 ({result.errors or 'no socket errors'}): "
                         f"raise EVENTS if {result.requests} reached {EVENTS}")
    return result.requests_per_s, cpu_us


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
            bearer.append(_round(served, url, harness.lua_request("GET", headers={"Authorization": f"Bearer {token}"})))
            nostr.append(_round(served, url, _nostr_script(keys, url)))
    print(f"backend {args.backend}, {args.rounds} alternating rounds of wrk -t1 -c16 -d{ROUND_S}s")
    for label, rounds in (("bearer Token", bearer), ("NIP-98", nostr)):
        rates = ", ".join(f"{rate:,.0f}" for rate, _ in rounds)
        print(f"GET /users/me {label + ':':<13} {statistics.median(r for r, _ in rounds):,.0f} req/s (median; rounds {rates}), "
              f"{statistics.median(c for _, c in rounds):,.0f} us CPU per request")
    ratio = statistics.median(r for r, _ in nostr) / statistics.median(r for r, _ in bearer)
    cpu = statistics.median(c for _, c in bearer) / statistics.median(c for _, c in nostr)
    print(f"NIP-98 / bearer: {ratio:.2f}x (target >= 0.7x); by CPU per request {cpu:.2f}x")


if __name__ == "__main__":
    main()
