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

Publishing against another commit (target of issue 15: with the Merkle tree, at least 90 %
of the throughput before it):

    git worktree add /tmp/before 1b85f0a
    python -m bench.decisions --backend sqlite --scenario publish --against /tmp/before --rounds 10

runs this checkout's gateway and the other checkout's side by side (each on its own
database, this venv for both) and measures POST /decisions on each in alternating rounds
(this, that, then that, this, ...): on a shared machine throughput drifts by more than the
difference measured, over minutes, and whichever runs second in a pair tends to lose, so
each goes first as often as the other. It prints every round's req/s and the server's CPU
time per request (``/proc/PID/stat``; one HTTP process), then their ratios: on the sums
of the rounds, the median round's, and the median CPU per request's. ``--no-metrics``
serves both without an ops listener, so without counting (code from before issue 16 has
none to turn off).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.decisions import POSTGRES_SEQUENCE
from bench import harness

STATEMENT = "The release of 2026-11-21 is approved; rollback plan attached as item 4."
SMALL = 1_000
# Each gateway's unmeasured run before the rounds of --against.
WARM_UP_S = 3

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


def publish_against(backend: str, duration: int, workers: int, other: Path, rounds: int, env: dict[str, str]) -> None:
    """POST /decisions on this checkout and on ``other``, in alternating rounds (see the module's text)."""
    if not (other / "src" / "agent_gateway").is_dir():
        raise SystemExit(f"--against {other}: not a checkout of agent-gateway (no src/agent_gateway)")
    lua = harness.lua_request("POST", {"statement": STATEMENT})
    env = {harness.WORKERS: str(workers), **env}
    with harness.gateway(backend, env) as this, harness.gateway(backend, env, src=other / "src") as that:
        gateways = {"this": this, "that": that}
        for served in gateways.values():  # unmeasured: each gateway's first batches, caches, WAL
            harness.wrk(served.agent_url + "/decisions", lua, duration_s=WARM_UP_S)
        runs: dict[str, list[tuple[float, float]]] = {"this": [], "that": []}
        for number in range(rounds):
            for name in ("this", "that") if number % 2 == 0 else ("that", "this"):
                served = gateways[name]
                result, cpu = harness.wrk_cpu(served.process.pid, served.agent_url + "/decisions", lua, duration_s=duration)
                runs[name].append((result.requests_per_s, cpu))
            print(
                f"[{backend}] round {number + 1}: "
                + "   ".join(f"{name} {runs[name][-1][0]:7,.0f} req/s, CPU {runs[name][-1][1]:5.1f} µs/request" for name in runs)
            )
    this_rps, that_rps = ([rps for rps, _ in runs[name]] for name in ("this", "that"))
    per_round = sorted(a / b for a, b in zip(this_rps, that_rps, strict=True))
    cpu = statistics.median(c for _, c in runs["that"]) / statistics.median(c for _, c in runs["this"])
    print(
        f"[{backend}] POST /decisions, this / {other} over {rounds} alternating rounds: "
        f"{sum(this_rps) / sum(that_rps):.1%} on the sums, median round {statistics.median(per_round):.1%} "
        f"({per_round[0]:.0%}-{per_round[-1]:.0%}), by median CPU per request {cpu:.1%}"
    )


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
    parser.add_argument("--against", type=Path, help="publish: compare with the checkout at this path, in alternating rounds")
    parser.add_argument("--rounds", type=int, default=10, help="with --against: rounds of each gateway")
    parser.add_argument("--no-metrics", action="store_true", help="with --against: serve both without an ops listener")
    args = parser.parse_args()
    if args.against is not None:
        if args.scenario != "publish":
            raise SystemExit("--against compares the publish scenario only: add --scenario publish")
        env = {"AGENT_GATEWAY_OPS_LISTEN": ""} if args.no_metrics else {}
        for backend in ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]:
            publish_against(backend, args.duration, args.workers, args.against.resolve(), args.rounds, env)
        return
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
