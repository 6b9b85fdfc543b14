"""Message logs: write and poll throughput of one User's log, and the echo agent's answer time.

    python -m bench.messages --backend sqlite
    python -m bench.messages --backend postgresql --duration 10

Each run starts a fresh real gateway (``bench.harness``), admits one User and
issues it a Token (``agent-gateway tokens issue``), then measures with
``wrk -t1 -c16``:

1. inbound ``POST /messages`` (Public) from 16 connections of that ONE User:
   Messages stored per second (read back from the log, not from wrk's count)
   and the share answered 503. The gateway runs with no Signal Handler here,
   so the Signal Worker does not start an agent process per Message and the
   numbers are the write path's own;
2. outbound ``POST /messages`` (Agent) to the same User, likewise;
3. once the Worker has ended every Signal, ``GET /messages?after=`` polling
   (Public, and the Agent's ``?user=``);
4. then, on a second gateway that runs the demo echo agent for each
   ``message.received`` Signal, the time from sending an inbound Message to
   the agent's outbound answer being readable with ``after=<seq>``, p50/p99
   over sequential samples.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import httpx
import orjson

from agent_gateway.auth import service as auth_service
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness
from tests.served import ServedGateway

# No Handler: the write path is measured without an agent process per Message.
NO_HANDLERS = {"AGENT_GATEWAY_HANDLERS": "{}"}
ECHO = {
    # One echo process per Run (the figure before the persistent runtime; bench.agent measures that).
    "AGENT_GATEWAY_RUNTIME_MODE": "per-run",
    "AGENT_GATEWAY_RUNTIME_COMMAND": orjson.dumps([sys.executable, "-m", "agent_gateway.runtimes.echo"]).decode(),
    "AGENT_GATEWAY_HANDLERS": orjson.dumps(
        {
            "message.received": {
                "template": "A message from user {{ userId }}:\n\n{{ text }}",
                "session": "user_{{ userId }}",
            }
        }
    ).decode(),
}
ANSWER_SAMPLES = 40
POLL_INTERVAL_S = 0.005
ANSWER_TIMEOUT_S = 30


def admit_with_token(served: ServedGateway) -> tuple[str, dict[str, str]]:
    user_id = served.cli_json("users", "add")["id"]
    token = served.cli_json("tokens", "issue", user_id)["token"]
    return user_id, {"Authorization": f"Bearer {token}"}


# The Tokens of Users admitted with admit_many: longer than any benchmark.
BENCH_TOKEN_TTL_MS = 24 * 3600 * 1000


def admit_many(served: ServedGateway, count: int) -> list[tuple[str, dict[str, str]]]:
    """``count`` Users, each with a Token, as :func:`admit_with_token` gives them, admitted with the
    operator's Python API (what ``users add`` and ``tokens issue`` run) in one transaction on the
    gateway's database: two commands per User took minutes for a burst of hundreds of Users."""

    if served.database_url is None:
        raise SystemExit("admit_many needs the gateway's database URL in its environment")
    url = served.database_url

    async def admit() -> list[tuple[str, dict[str, str]]]:
        store = Store(url)
        try:
            async with store.transaction() as conn:
                admitted = []
                for _ in range(count):
                    user = await users_service.admit(conn)
                    issued = await auth_service.issue_token(conn, user.id, ttl_ms=BENCH_TOKEN_TTL_MS)
                    admitted.append((user.id, {"Authorization": f"Bearer {issued.token}"}))
                return admitted
        finally:
            await store.close()

    return asyncio.run(admit())


def newest_seq(served: ServedGateway, user_id: str) -> int:
    page = httpx.get(f"{served.agent_url}/messages", params={"user": user_id, "limit": "1"}).json()["messages"]
    return page[0]["seq"] if page else 0


def drain(served: ServedGateway) -> float:
    """Seconds until the newest Signal has ended (the Worker takes them oldest first).

    The reads are measured after this, not beside a Worker still busy with the
    inbound phase's Signals.
    """
    started = time.perf_counter()
    while True:
        newest = httpx.get(f"{served.agent_url}/signals", params={"limit": "1"}).json()["signals"]
        if not newest or newest[0]["state"] not in ("pending", "processing"):
            return time.perf_counter() - started
        time.sleep(0.2)


def measure_writes(backend: str, duration: int, workers: int) -> None:
    with harness.gateway(backend, {**NO_HANDLERS, harness.WORKERS: str(workers)}) as served:
        user_id, auth = admit_with_token(served)
        idle = harness.rss_mb(served.process.pid)
        writes = [
            ("inbound  POST /messages (Public, one User)", served.public_url, {"text": "benchmark"}, auth),
            ("outbound POST /messages (Agent, one User)", served.agent_url, {"userId": user_id, "text": "answer"}, {}),
        ]
        for label, base, body, headers in writes:
            before = newest_seq(served, user_id)
            result = harness.wrk(f"{base}/messages", harness.lua_request("POST", body, headers), duration_s=duration)
            stored = newest_seq(served, user_id) - before
            busy = 100 * result.non_2xx / max(result.requests, 1)
            print(result.line(label))
            print(f"{'':<44} {stored / duration:>9,.0f} Messages stored/s   503: {busy:.2f}% of {result.requests:,}")
        print(f"{'':<44} then {drain(served):.1f} s until the Signal Worker had ended every Signal")
        latest = newest_seq(served, user_id)
        polls = [
            ("GET /messages?after=<newest> (Public)", f"{served.public_url}/messages?after={latest}", auth),
            ("GET /messages?after=<newest-20> (Public)", f"{served.public_url}/messages?after={latest - 20}", auth),
            ("GET /messages?user=&after=<newest> (Agent)", f"{served.agent_url}/messages?user={user_id}&after={latest}", {}),
        ]
        for label, url, headers in polls:
            print(harness.wrk(url, harness.lua_request("GET", None, headers), duration_s=duration).line(label))
        print(f"resident memory: idle {idle:.0f} MB, after load {harness.rss_mb(served.process.pid):.0f} MB")


def measure_answers(backend: str) -> None:
    with harness.gateway(backend, ECHO) as served, httpx.Client(timeout=ANSWER_TIMEOUT_S) as client:
        user_id, auth = admit_with_token(served)
        samples = []
        for n in range(ANSWER_SAMPLES):
            started = time.perf_counter()
            sent = client.post(f"{served.public_url}/messages", json={"text": f"ping {n}"}, headers=auth)
            sent.raise_for_status()
            poll = {"after": str(sent.json()["seq"])}
            while not any(
                m["direction"] == "outbound"
                for m in client.get(f"{served.public_url}/messages", params=poll, headers=auth).json()["messages"]
            ):
                if time.perf_counter() - started > ANSWER_TIMEOUT_S:
                    raise SystemExit(f"no answer within {ANSWER_TIMEOUT_S}s; gateway log:\n{served.output()}")
                time.sleep(POLL_INTERVAL_S)
            samples.append((time.perf_counter() - started) * 1000)
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    print(
        f"{'inbound POST -> echo answer readable':<44} p50 {cuts[49]:7.1f} ms   p99 {cuts[98]:7.1f} ms"
        f"   ({ANSWER_SAMPLES} sequential samples, polled every {POLL_INTERVAL_S * 1000:.0f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--skip-answers", action="store_true", help="skip the echo agent's answer time")
    parser.add_argument("--workers", type=int, default=1, help="HTTP processes (http.workers)")
    args = parser.parse_args()
    print(f"backend {args.backend}, wrk -t{harness.WRK_THREADS} -c{harness.WRK_CONNECTIONS} -d{args.duration}s, {args.workers} HTTP process(es)")
    measure_writes(args.backend, args.duration, args.workers)
    if not args.skip_answers:
        measure_answers(args.backend)


if __name__ == "__main__":
    main()
