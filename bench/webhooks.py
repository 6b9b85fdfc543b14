"""Webhooks: what an outbox row costs the hot paths, and the time from an event to its delivery.

    python -m bench.webhooks                                  # both scenarios, both backends
    python -m bench.webhooks --backend sqlite --scenario cost --rounds 6
    python -m bench.webhooks --scenario latency

Scenarios (targets of issue 29):
  cost     POST /decisions (Agent) and the inbound POST /messages (Public, one User) on two
           gateways side by side, one with a [[webhooks]] endpoint subscribed to
           decision.published and message.inbound, one with none, in alternating rounds
           (wrk -t1 -c16; each goes first as often as the other, as bench.decisions --against):
           the subscribed one's req/s as a share of the other's, target >= 90 %.
           ``--roles api`` (the default) serves both with the api role only, so the rows are
           written and not sent: the cost of the outbox itself. ``--roles all`` runs the
           deliverer in the same process too, sending every row to a local receiver while
           wrk writes: the cost of delivery, on the same two cores.
  latency  one Decision published every 20 ms (no other load), each delivered to a local
           receiver: p50 and p99 of the time from the Decision's createdAt to the receiver
           reading the request (one clock, one machine).

The receiver is a small asyncio HTTP server in this process that answers 204 at once; it
checks nothing (tests/webhooks verifies signatures). No Signal Handler is configured, so no
agent process runs per Message.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import threading
import time
from datetime import UTC, datetime

import httpx
import orjson

from bench import harness
from bench.messages import NO_HANDLERS, admit_with_token
from bench.decisions import STATEMENT
from tests.served import ServedGateway

WARM_UP_S = 3
SECRET_VARIABLE = "BENCH_WEBHOOK_SECRET"
LATENCY_SAMPLES = 500
LATENCY_INTERVAL_S = 0.02


class Receiver:
    """An HTTP/1.1 server on a free loopback port answering every POST 204; records each
    request's arrival time by its ``webhook-timestamp``-free body's ``timestamp``."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []  # (the event's timestamp, arrival epoch seconds)
        self.count = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                arrived = time.time()
                self.count += 1
                self.arrivals.append((orjson.loads(body)["timestamp"], arrived))
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"


def subscribed(receiver: Receiver, events: list[str]) -> dict[str, str]:
    table = {"url": receiver.url, "events": events, "secret_env": SECRET_VARIABLE, "allow_private": True}
    return {"AGENT_GATEWAY_WEBHOOKS": orjson.dumps([table]).decode(), SECRET_VARIABLE: secret()}


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def cost(backend: str, duration: int, rounds: int, roles: str, receiver: Receiver) -> None:
    env = {**NO_HANDLERS, "AGENT_GATEWAY_LOG_LEVEL": "WARNING"}
    hooked = {**env, **subscribed(receiver, ["decision.published", "message.inbound"])}
    args = ("--role", roles)
    with harness.gateway(backend, env) as plain_base, harness.gateway(backend, hooked) as hooked_base:
        # harness.gateway serves every role; serve these again with --role (the same databases).
        plain_base.stop()
        hooked_base.stop()
        plain = ServedGateway.spawn(plain_base.directory, plain_base.env, args)
        with_hooks = ServedGateway.spawn(hooked_base.directory, hooked_base.env, args)
        try:
            gateways = {"none": plain, "subscribed": with_hooks}
            routes = {}
            for name, served in gateways.items():
                _, headers = admit_with_token(served)
                routes[name] = {
                    "POST /decisions": (served.agent_url + "/decisions", harness.lua_request("POST", {"statement": STATEMENT})),
                    "inbound POST /messages": (
                        served.public_url + "/messages", harness.lua_request("POST", {"text": "hello"}, headers)
                    ),
                }
            for route in ("POST /decisions", "inbound POST /messages"):
                for name in gateways:  # unmeasured: first batches, caches, WAL
                    harness.wrk(*routes[name][route], duration_s=WARM_UP_S)
                runs: dict[str, list[tuple[float, float]]] = {"subscribed": [], "none": []}
                for number in range(rounds):
                    order = ("subscribed", "none") if number % 2 == 0 else ("none", "subscribed")
                    for name in order:
                        result, cpu = harness.wrk_cpu(gateways[name].process.pid, *routes[name][route], duration_s=duration)
                        if result.non_2xx:
                            print(f"[{backend}] {name}: {result.non_2xx} non-2xx answers")
                        runs[name].append((result.requests_per_s, cpu))
                    print(
                        f"[{backend}, --role {roles}] {route} round {number + 1}: "
                        + "   ".join(f"{n} {runs[n][-1][0]:7,.0f} req/s, CPU {runs[n][-1][1]:6.1f} µs/request" for n in runs)
                    )
                hooked_rps, plain_rps = ([rps for rps, _ in runs[n]] for n in ("subscribed", "none"))
                per_round = sorted(a / b for a, b in zip(hooked_rps, plain_rps, strict=True))
                cpu = statistics.median(c for _, c in runs["none"]) / statistics.median(c for _, c in runs["subscribed"])
                print(
                    f"[{backend}, --role {roles}] {route}, subscribed / none over {rounds} alternating rounds: "
                    f"{sum(hooked_rps) / sum(plain_rps):.1%} on the sums, median round {statistics.median(per_round):.1%} "
                    f"({per_round[0]:.0%}-{per_round[-1]:.0%}), by median CPU per request {cpu:.1%} (target >= 90 %)"
                )
        finally:
            plain.stop()
            with_hooks.stop()


def latency(backend: str, receiver: Receiver) -> None:
    env = {**NO_HANDLERS, "AGENT_GATEWAY_LOG_LEVEL": "WARNING", **subscribed(receiver, ["decision.published"])}
    with harness.gateway(backend, env) as served:
        receiver.arrivals.clear()
        with httpx.Client(base_url=served.agent_url) as client:
            for _ in range(LATENCY_SAMPLES):
                assert client.post("/decisions", json={"statement": STATEMENT}).status_code == 201
                time.sleep(LATENCY_INTERVAL_S)
        deadline = time.monotonic() + 60
        while len(receiver.arrivals) < LATENCY_SAMPLES and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = sorted(
            (arrived - datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()) * 1000
            for at, arrived in receiver.arrivals
        )
        p50, p99 = samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(
            f"[{backend}] event -> delivery over {len(samples)} Decisions, one every {LATENCY_INTERVAL_S * 1000:.0f} ms: "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {samples[-1]:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--scenario", choices=["cost", "latency", "all"], default="all")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--roles", choices=["api", "all"], default="api", help="cost: what the measured processes run")
    args = parser.parse_args()
    receiver = Receiver()
    receiver.start()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    for backend in ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]:
        if args.scenario in ("cost", "all"):
            cost(backend, args.duration, args.rounds, args.roles, receiver)
        if args.scenario in ("latency", "all"):
            latency(backend, receiver)
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
