"""Witnesses under load (issue 38): collection is off the request path.

    python -m bench.witnesses --backend sqlite --rounds 4 --duration 5

Two real witnesses (aics-witness from PyPI, as the tests run them: tests/servers.py) trust one log;
two gateways side by side, each on its own database and signing with the same Ed25519 key, one
with the two witnesses configured and one with none, take ``POST /decisions`` (wrk) in alternating
rounds (with, none, then none, with, ...; see bench/decisions.py on why), and the ratio of their
throughputs is printed (target >= 95 %), and that of the serving process's CPU per request (the
collector's passes included), which the shared machine's other load moves far less. Meanwhile the witnessed gateway's cosignatures are
counted: the witness requests per second at that publish rate (one per witness per collector pass,
passes at least ``collector.MIN_PASS_INTERVAL_S`` apart whatever the rate: coalescing), and again
at a sustained rate of at most 1,000 Decisions/s. Then, one Decision at a time into an idle
collector, the time from its 201 to the first ``GET /checkpoint/witnessed`` that holds it: p50
and p99.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench import harness
from bench.decisions import STATEMENT
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.transparency import collector, note
from tests import servers

LATENCY_SAMPLES = 100
PACED_RATE = 1_000  # Decisions/s, at most
PACED_CONNECTIONS = 16
CEILING_S = 120.0


def witnessed_size(client: httpx.Client) -> int:
    response = client.get("/checkpoint/witnessed")
    if response.status_code == 404:
        return 0
    return note.Checkpoint.parse(response.content[: response.content.index(b"\n\n") + 1]).size


def witness_requests(witness: servers.Witness) -> int:
    """The add-checkpoint requests the witness has answered: the lines of its access log."""
    return witness.running.log.read_text(errors="replace").count("POST /add-checkpoint")


def run(backend: str, duration: int, rounds: int) -> None:
    pem = keys.generate_pem("ed25519")
    identity = SigningIdentity(pem)
    origin = f"agent-gateway.bench/{uuid.uuid4().hex[:12]}"
    log_vkey = note.NoteSigner(origin, identity.key, identity.algorithm).key.vkey()
    with tempfile.TemporaryDirectory(prefix="agw-bench-witnesses-") as tmp, \
            servers.witness(Path(tmp) / "w1", "w1.bench/w", "DEBUG") as w1, \
            servers.witness(Path(tmp) / "w2", "w2.bench/w", "DEBUG") as w2:
        for listed in (w1, w2):
            listed.trust(origin, log_vkey)
        common = {"AGENT_GATEWAY_SIGNING_KEY": pem.decode() if isinstance(pem, bytes) else pem,
                  "AGENT_GATEWAY_TRANSPARENCY_ORIGIN": origin}
        listed = json.dumps([{"url": w.url, "vkey": w.vkey} for w in (w1, w2)])
        lua = harness.lua_request("POST", {"statement": STATEMENT})
        with harness.gateway(backend, {**common, "AGENT_GATEWAY_TRANSPARENCY_WITNESSES": listed}) as with_, \
                harness.gateway(backend, {**common, "AGENT_GATEWAY_TRANSPARENCY_ORIGIN": origin + "-none"}) as none:
            gateways = {"with": with_, "none": none}
            for served in gateways.values():
                harness.wrk(served.agent_url + "/decisions", lua, duration_s=2)
            runs: dict[str, list[float]] = {"with": [], "none": []}
            # The serving process's CPU per request (the collector's passes included): the machine's
            # other load moves it far less than the requests per second.
            cpu: dict[str, list[float]] = {"with": [], "none": []}
            requests: list[float] = []  # witness requests per second (both witnesses) in each "with" round
            with httpx.Client(base_url=with_.agent_url, timeout=30) as agent:
                for number in range(rounds):
                    for name in ("with", "none") if number % 2 == 0 else ("none", "with"):
                        served = gateways[name]
                        answered = sum(witness_requests(w) for w in (w1, w2))
                        started = time.monotonic()
                        result, cpu_us = harness.wrk_cpu(served.process.pid, served.agent_url + "/decisions", lua, duration_s=duration)
                        runs[name].append(result.requests_per_s)
                        cpu[name].append(cpu_us)
                        if name == "with":
                            elapsed = time.monotonic() - started
                            requests.append((sum(witness_requests(w) for w in (w1, w2)) - answered) / elapsed)
                    print(f"[{backend}] round {number + 1}: with {runs['with'][-1]:7,.0f} req/s   none {runs['none'][-1]:7,.0f} req/s")
                ratio = sorted(a / b for a, b in zip(runs["with"], runs["none"], strict=True))
                print(
                    f"[{backend}] POST /decisions, two witnesses / none over {rounds} alternating rounds: "
                    f"{sum(runs['with']) / sum(runs['none']):.1%} on the sums, median round {statistics.median(ratio):.1%}; "
                    f"witness requests (both) {statistics.median(requests):.1f}/s at {statistics.median(runs['with']):,.0f} Decisions/s"
                )
                with_cpu, none_cpu = statistics.median(cpu["with"]), statistics.median(cpu["none"])
                print(
                    f"[{backend}] server CPU per POST /decisions (median of rounds): with {with_cpu:.0f} us, "
                    f"none {none_cpu:.0f} us: throughput at equal CPU {none_cpu / with_cpu:.1%}"
                )
                # A sustained rate of at most 1,000 Decisions/s: each of wrk's 16 connections waits
                # 16 ms before each request (wrk's delay()).
                paced = lua + f"function delay()\n  return {PACED_CONNECTIONS * 1000 // PACED_RATE}\nend\n"
                answered = sum(witness_requests(w) for w in (w1, w2))
                started = time.monotonic()
                result = harness.wrk(with_.agent_url + "/decisions", paced, duration_s=duration, connections=PACED_CONNECTIONS)
                elapsed = time.monotonic() - started
                print(
                    f"[{backend}] at a sustained {result.requests_per_s:,.0f} Decisions/s: witness requests (both) "
                    f"{(sum(witness_requests(w) for w in (w1, w2)) - answered) / elapsed:.1f}/s"
                )
                latencies = []
                for _ in range(LATENCY_SAMPLES):
                    # Each publish finds the collector idle (waiting for one), not inside its least
                    # spacing of passes, which a publish during a pass waits out (up to that long).
                    time.sleep(collector.MIN_PASS_INTERVAL_S)
                    agent.post("/decisions", json={"statement": STATEMENT}).raise_for_status()
                    published = time.monotonic()
                    size = int(agent.get("/checkpoint").content.split(b"\n")[1])  # the tree holding it
                    while witnessed_size(agent) < size and time.monotonic() < published + CEILING_S:
                        time.sleep(0.005)
                    latencies.append((time.monotonic() - published) * 1000)
                latencies.sort()
                print(
                    f"[{backend}] publish -> witnessed checkpoint, {LATENCY_SAMPLES} Decisions one at a time: "
                    f"p50 {latencies[len(latencies) // 2]:.0f} ms, p99 {latencies[int(len(latencies) * 0.99) - 1]:.0f} ms"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    run(args.backend, args.duration, args.rounds)


if __name__ == "__main__":
    main()
