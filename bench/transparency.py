"""The auditable Decision log: proof latency as the log grows, and an audit from nothing.

    python -m bench.transparency                                # every scenario, both backends
    python -m bench.transparency --backend sqlite --scenario proofs --large 1000000
    python -m bench.transparency --scenario audit --audit-size 100000

Scenarios (targets of issue 15, on this 2-core machine):
  proofs  GET /decisions/{seq}/proof (seq random) and GET /checkpoint/consistency?from=M
          (M random), ``wrk -t1 -c1``: p99 on 1,000,000 Decisions <= 5 ms and within 1.2x
          of that on 1,000 (two gateways, measured in alternating rounds after an
          unmeasured warm-up; the median p99 of each size)
  audit   ``agent-gateway audit`` of a log of 100,000 Decisions from nothing (every JWS
          checked, the root rebuilt): the time it takes

POST /decisions throughput with the tree is ``python -m bench.decisions --scenario publish``,
run here and on a checkout of main (its target: at least 90 % of main's).

The logs are filled in the set-up, not through the API: the Decision rows with one bulk
write and the tree's nodes computed here with ``merkle`` and written with
them (COPY on PostgreSQL), exactly the rows publishing would have written. The proofs
scenario gives every row the same real JWS (rows of their real size); the audit scenario
signs each Decision, since the audit checks every signature.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import orjson

from agent_gateway import clock, merkle
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.store.queries import tree
from agent_gateway.store.queries.decisions import POSTGRES_SEQUENCE
from bench import harness
from bench.decisions import STATEMENT, settle
from tests.served import ServedGateway, cli_env

SMALL = 1_000
CHUNK = 50_000
# Latency is measured one request at a time: with more connections than cores it is queueing.
LATENCY_CONNECTIONS = 1
WARM_UP_S = 5

Row = tuple[int, str, str, str, int]  # seq, statement JSON, jws, createdAt, leaf index


def rows(first: int, last: int, jws_of: Callable[[int, str], str]) -> Iterator[Row]:
    created_at = clock.now_iso()
    for seq in range(first, last + 1):
        yield seq, orjson.dumps(f"Decision number {seq}").decode(), jws_of(seq, created_at), created_at, seq - 1


def same_jws() -> Callable[[int, str], str]:
    identity = SigningIdentity(keys.generate_pem("ed25519"))
    jws = identity.sign(orjson.dumps({"seq": 1, "createdAt": clock.now_iso(), "statement": STATEMENT}), DECISION_TYP)
    return lambda seq, created_at: jws


def signed_by(key_file: Path) -> Callable[[int, str], str]:
    """Real Decisions of the deployment's key, as the gateway signs them."""
    identity = SigningIdentity(key_file.read_bytes())

    def sign(seq: int, created_at: str) -> str:
        payload = orjson.dumps({"seq": seq, "createdAt": created_at, "statement": f"Decision number {seq}"})
        return identity.sign(payload, DECISION_TYP)

    return sign


def fill(url: str, first: int, last: int, jws_of: Callable[[int, str], str]) -> float:
    """Append Decisions ``first..last`` (to a log of ``first - 1``) with their tree; the seconds it took."""
    started = time.perf_counter()
    frontier = asyncio.run(_frontier(url, first - 1))
    size = first - 1
    batch: list[Row] = []
    for row in rows(first, last, jws_of):
        batch.append(row)
        if len(batch) == CHUNK or row[0] == last:
            completed, frontier = merkle.appended(frontier, size, [merkle.leaf_hash(r[2].encode()) for r in batch])
            nodes = [(tree.key(node), hash_) for node, hash_ in completed]
            size += len(batch)
            _write(url, batch, nodes)
            batch = []
    if url.startswith("postgresql"):
        # CHECKPOINT: the fill's pages are written out now, not by the checkpointer during the measurement.
        asyncio.run(_postgres(url, f"SELECT setval('{POSTGRES_SEQUENCE}', {last})", "VACUUM ANALYZE", "CHECKPOINT"))
    return time.perf_counter() - started


async def _frontier(url: str, size: int) -> list[bytes]:
    if size == 0:
        return []
    wanted = [tree.key(node) for node in merkle.subtrees(0, size)]
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            found = dict(conn.execute(f"SELECT node, hash FROM decision_tree WHERE node IN ({','.join(map(str, wanted))})"))
    else:
        conn = await asyncpg.connect(url)
        try:
            found = dict(await conn.fetch("SELECT node, hash FROM decision_tree WHERE node = ANY($1::bigint[])", wanted))
        finally:
            await conn.close()
    return [bytes(found[key]) for key in wanted]


def _write(url: str, batch: list[Row], nodes: list[tuple[int, bytes]]) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.executemany("INSERT INTO decisions (seq, statement, jws, created_at, leaf_index) VALUES (?, ?, ?, ?, ?)", batch)
            conn.executemany("INSERT INTO decision_tree (node, hash) VALUES (?, ?)", nodes)
        return

    async def copy() -> None:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                columns = ["seq", "statement", "jws", "created_at", "leaf_index"]
                await conn.copy_records_to_table("decisions", records=batch, columns=columns)
                await conn.copy_records_to_table("decision_tree", records=nodes, columns=["node", "hash"])
        finally:
            await conn.close()

    asyncio.run(copy())


async def _postgres(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def random_proof(size: int) -> str:
    return (
        "math.randomseed(15)\n"
        "request = function()\n"
        f'  return wrk.format("GET", "/decisions/" .. math.random(1, {size}) .. "/proof")\n'
        "end\n"
    )


def random_consistency(size: int) -> str:
    return (
        "math.randomseed(15)\n"
        "request = function()\n"
        f'  return wrk.format("GET", "/checkpoint/consistency?from=" .. math.random(1, {size}))\n'
        "end\n"
    )


def proofs(backend: str, duration: int, large: int, rounds: int) -> None:
    """Two gateways, one on a log of SMALL Decisions and one on ``large``, measured in
    alternating rounds (small, large, large, small, ...), so that a drift of the shared
    machine's load weighs on both alike; the p99s compared are each size's median."""
    with harness.gateway(backend) as small, harness.gateway(backend) as big:
        jws_of = same_jws()
        fill(small.env["AGENT_GATEWAY_DATABASE_URL"], 1, SMALL, jws_of)
        seconds = fill(big.env["AGENT_GATEWAY_DATABASE_URL"], 1, large, jws_of)
        print(f"[{backend}] filled {large:,} Decisions and their tree in {seconds:.0f} s")
        settle()
        for served, size in [(small, SMALL), (big, large)]:
            warm_up(served, size)
        p99s: dict[tuple[int, str], list[float]] = {}
        for pair in range(rounds):
            order = [(small, SMALL), (big, large)] if pair % 2 == 0 else [(big, large), (small, SMALL)]
            for served, size in order:
                for name, p99 in measure(backend, served, size, duration).items():
                    p99s.setdefault((size, name), []).append(p99)
        for name in ("inclusion proof", "consistency proof"):
            small_p99, big_p99 = statistics.median(p99s[SMALL, name]), statistics.median(p99s[large, name])
            print(
                f"[{backend}] {name}, median p99 of {rounds} runs each: {big_p99:.2f} ms on {large:,}, "
                f"{big_p99 / small_p99:.2f}x the {small_p99:.2f} ms on {SMALL:,} (targets <= 5 ms, <= 1.2x)"
            )


def scripts(size: int) -> list[tuple[str, str]]:
    return [("inclusion proof", random_proof(size)), ("consistency proof", random_consistency(size))]


def warm_up(served: ServedGateway, size: int) -> None:
    """Unmeasured: the set-up wrote the log in bulk behind the gateway's back, so its first proofs
    would fill the cache of the tree's top levels (``store.queries.tree``), and read pages into the
    database's and the OS's caches, that a log grown through the API has already."""
    for _, lua in scripts(size):
        harness.wrk(served.agent_url + "/", lua, duration_s=WARM_UP_S, connections=LATENCY_CONNECTIONS)


def measure(backend: str, served: ServedGateway, size: int, duration: int) -> dict[str, float]:
    p99 = {}
    for name, lua in scripts(size):
        result = harness.wrk(served.agent_url + "/", lua, duration_s=duration, connections=LATENCY_CONNECTIONS)
        print(result.line(f"[{backend}] {name} ({size:,}) -c{LATENCY_CONNECTIONS}"))
        assert result.non_2xx == 0, "a proof request failed"
        p99[name] = result.latency_ms["99"]
    return p99


def audit(backend: str, size: int) -> None:
    with harness.gateway(backend) as served:
        url = served.env["AGENT_GATEWAY_DATABASE_URL"]
        started = time.perf_counter()
        fill(url, 1, size, signed_by(served.directory / "signing-key.pem"))
        print(f"[{backend}] filled {size:,} signed Decisions and their tree in {time.perf_counter() - started:.0f} s")
        settle()
        jwks = served.directory / "jwks.json"
        identity = SigningIdentity((served.directory / "signing-key.pem").read_bytes())
        jwks.write_bytes(orjson.dumps(identity.jwks()))
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "agent_gateway", "audit", served.agent_url, "--jwks", str(jwks)],
            env=cli_env(served.directory / "none.toml"),
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(f"audit failed: {result.stderr}")
        report = orjson.loads(result.stdout)
        assert report["audited"] == size and base64.b64decode(report["rootHash"])
        print(f"[{backend}] agent-gateway audit of {size:,} Decisions from nothing: {seconds:.1f} s ({size / seconds:,.0f} Decisions/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--scenario", choices=["proofs", "audit", "all"], default="all")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--large", type=int, default=1_000_000, help="Decisions in the long log")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of proof runs on the short and the long log")
    parser.add_argument("--audit-size", type=int, default=100_000, help="Decisions the audit checks")
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if args.scenario in ("proofs", "all"):
            proofs(backend, args.duration, args.large, args.rounds)
        if args.scenario in ("audit", "all"):
            audit(backend, args.audit_size)


if __name__ == "__main__":
    main()
