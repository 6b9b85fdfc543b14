"""The Decision log under load: publishing, reading the newest page, and a cursor read on a long log.

    python -m bench.decisions                          # every scenario, both backends
    python -m bench.decisions --backend sqlite --scenario publish
    python -m bench.decisions --scenario scale --large 1000000

Scenarios (targets of issue 4, ``wrk -t1 -c16 -d10s`` on this 2-core machine):
  publish  POST /decisions                        >= 2,500 req/s on SQLite, >= 1,700 on PostgreSQL
  read     GET /decisions?limit=50 (log of 1,000)  >= 3,500 req/s
  scale    GET /decisions?before=N, N random over the log: latency on 1,000,000 Decisions
           within 1.2x of that on 1,000 (a cursor read does not slow down as the log grows)

The logs are filled with one bulk INSERT in the set-up (not through the API); every row
carries a real Decision's JWS so rows have their real size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.decisions import POSTGRES_SEQUENCE
from agent_gateway.store.engine import Store
from bench import harness

STATEMENT = "The release of 2026-11-21 is approved; rollback plan attached as item 4."
SMALL = 1_000

_FILL_SQLITE = sa.text(
    "WITH RECURSIVE n(g) AS (SELECT :first UNION ALL SELECT g + 1 FROM n WHERE g < :last) "
    "INSERT INTO decisions (seq, statement, jws, created_at) "
    "SELECT g, '\"Decision number ' || g || '\"', :jws, :created_at FROM n"
)
_FILL_POSTGRES = sa.text(
    "INSERT INTO decisions (seq, statement, jws, created_at) "
    "SELECT g, '\"Decision number ' || g || '\"', :jws, :created_at FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g"
)
_SET_SEQUENCE = sa.text(f"SELECT setval('{POSTGRES_SEQUENCE}', :last)")


async def fill(url: str, first: int, last: int) -> float:
    """Append Decisions ``first..last`` with one INSERT; returns the seconds it took."""
    identity = SigningIdentity(keys.generate_pem("ed25519"))
    jws = identity.sign(f'{{"seq":{last},"createdAt":"{clock.now_iso()}","statement":"{STATEMENT}"}}'.encode(), "service-decision+jws")
    store = Store(url)
    started = time.perf_counter()
    try:
        async with store.transaction() as conn:
            values = {"first": first, "last": last, "jws": jws, "created_at": clock.now_iso()}
            if store.dialect == "postgresql":
                await conn.execute(_FILL_POSTGRES, values)
                await conn.execute(_SET_SEQUENCE, {"last": last})
            else:
                await conn.execute(_FILL_SQLITE, values)
        if store.dialect == "postgresql":
            async with store.engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(sa.text("VACUUM ANALYZE decisions"))
    finally:
        await store.close()
    return time.perf_counter() - started


def random_before(size: int) -> str:
    """A wrk script reading the page below a random number of a log of ``size``."""
    return (
        "math.randomseed(4)\n"
        "request = function()\n"
        f'  return wrk.format("GET", "/decisions?before=" .. math.random(2, {size + 1}))\n'
        "end\n"
    )


def publish(backend: str, duration: int, workers: int) -> None:
    with harness.gateway(backend, {harness.WORKERS: str(workers)}) as served:
        lua = harness.lua_request("POST", {"statement": STATEMENT})
        result = harness.wrk(served.agent_url + "/decisions", lua, duration_s=duration)
        print(result.line(f"[{backend}] POST /decisions"))


def read(backend: str, duration: int, workers: int) -> None:
    with harness.gateway(backend, {harness.WORKERS: str(workers)}) as served:
        asyncio.run(fill(served.env["AGENT_GATEWAY_DATABASE_URL"], 1, SMALL))
        result = harness.wrk(served.agent_url + "/decisions?limit=50", "", duration_s=duration)
        print(result.line(f"[{backend}] GET /decisions?limit=50 ({SMALL:,})"))


def settle() -> None:
    """Let the bulk fill reach the disk, so that the kernel's write-back is not measured with the reads."""
    os.sync()
    time.sleep(1)


def scale(backend: str, duration: int, large: int, workers: int) -> None:
    with harness.gateway(backend, {harness.WORKERS: str(workers)}) as served:
        url = served.env["AGENT_GATEWAY_DATABASE_URL"]
        asyncio.run(fill(url, 1, SMALL))
        settle()
        small = harness.wrk(served.agent_url + "/decisions", random_before(SMALL), duration_s=duration)
        print(small.line(f"[{backend}] GET /decisions?before=N ({SMALL:,})"))
        seconds = asyncio.run(fill(url, SMALL + 1, large))
        print(f"[{backend}] filled to {large:,} Decisions in {seconds:.0f} s")
        settle()
        big = harness.wrk(served.agent_url + "/decisions", random_before(large), duration_s=duration)
        print(big.line(f"[{backend}] GET /decisions?before=N ({large:,})"))
        ratio = big.latency_ms["50"] / small.latency_ms["50"]
        print(f"[{backend}] p50 latency ratio {large:,} / {SMALL:,}: {ratio:.2f} (target <= 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--scenario", choices=["publish", "read", "scale", "all"], default="all")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--large", type=int, default=1_000_000, help="Decisions in the long log")
    parser.add_argument("--workers", type=int, default=1, help="HTTP processes (http.workers)")
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    print(f"wrk -t{harness.WRK_THREADS} -c{harness.WRK_CONNECTIONS} -d{args.duration}s, {args.workers} HTTP process(es)")
    for backend in backends:
        if args.scenario in ("publish", "all"):
            publish(backend, args.duration, args.workers)
        if args.scenario in ("read", "all"):
            read(backend, args.duration, args.workers)
        if args.scenario in ("scale", "all"):
            scale(backend, args.duration, args.large, args.workers)


if __name__ == "__main__":
    main()
