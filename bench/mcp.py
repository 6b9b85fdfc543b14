"""A tool call through ``/mcp`` against the same route called directly: latency, both backends.

    python -m bench.mcp [--backend sqlite|postgresql|both] [--rounds 10] [--calls 100]

Each backend gets a fresh real gateway (``bench.harness``: ``init``, then
``serve``, one process). For ``publish_decision`` (``POST /decisions``),
``send_message`` (``POST /messages``) and ``read_decisions`` (``GET
/decisions``), it makes ``--calls`` sequential calls in each of four ways,
in alternating rounds (route, raw MCP, SDK client, SDK client with the
handshake, route, ...) so that the machine's load falls on all of them alike:

- ``route``: the HTTP route, with ``bench.rawhttp`` (a kept-alive raw HTTP/1.1 client);
- ``mcp raw``: the tool through ``/mcp`` with the same raw client, one kept-alive
  connection, the ``tools/call`` request written by the SDK's types (the
  2025-11-25 protocol, as agent CLIs speak it): what the server adds;
- ``mcp sdk``: the tool with the official SDK's client (``mcp.Client``, its
  default negotiation: the 2026-07-28 protocol, one self-contained request a
  call): what an agent sees, the client's own cost included;
- ``mcp sdk hs``: the same client made to use the initialize handshake
  (``mode="legacy"``), as agent CLIs speaking the 2025 protocols do.

It prints p50 and p99 of each, and checks the target: ``publish_decision`` and
``send_message`` through ``/mcp`` within 2 × the route's p50 + 1 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp

from bench import harness, rawhttp
from tests.served import ServedGateway

HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
Call = Callable[[int], Awaitable[None]]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def tools_call(name: str, arguments: dict[str, Any], request_id: int) -> bytes:
    request = mcp.types.JSONRPCRequest(
        jsonrpc="2.0", id=request_id, method="tools/call", params={"name": name, "arguments": arguments}
    )
    return request.model_dump_json(by_alias=True, exclude_none=True).encode()


def check(answer: tuple[int, Any], *expected: int) -> Any:
    status, body = answer
    if status not in expected:
        raise SystemExit(f"answered {status}: {body}")
    return body


async def measure(call: Call, calls: int) -> list[float]:
    samples = []
    for n in range(calls):
        started = time.perf_counter()
        await call(n)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def bench_backend(served: ServedGateway, rounds: int, calls: int) -> dict[tuple[str, str], list[float]]:
    user = served.cli_json("users", "add")["id"]
    operations: dict[str, tuple[str, str, Callable[[int], Any]]] = {
        "publish_decision": ("POST", "/decisions", lambda n: {"statement": f"decision {n}"}),
        "send_message": ("POST", "/messages", lambda n: {"userId": user, "text": f"message {n}"}),
        "read_decisions": ("GET", "/decisions", lambda n: {}),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    async with (
        rawhttp.Connection(served.agent_url) as route,
        rawhttp.Connection(served.agent_url, HEADERS) as raw,
        mcp.Client(f"{served.agent_url}/mcp") as sdk,
        mcp.Client(f"{served.agent_url}/mcp", mode="legacy") as handshake,
    ):
        for tool, (method, path, arguments) in operations.items():

            async def by_route(n: int) -> None:
                if method == "GET":
                    check(await route.get(path), 200)
                else:
                    check(await route.post(path, arguments(n)), 201)

            async def by_raw(n: int) -> None:
                answer = check(await raw.request("POST", "/mcp", tools_call(tool, arguments(n), n)), 200)
                if answer["result"].get("isError"):
                    raise SystemExit(f"{tool}: {answer}")

            def by_client(client: mcp.Client) -> Call:
                async def call(n: int) -> None:
                    result = await client.call_tool(tool, arguments(n))
                    if result.is_error:
                        raise SystemExit(f"{tool}: {result.content}")

                return call

            ways = {"route": by_route, "mcp raw": by_raw, "mcp sdk": by_client(sdk), "mcp sdk hs": by_client(handshake)}
            for way, call in ways.items():  # warm-up
                await measure(call, 10)
            for _ in range(rounds):
                for way, call in ways.items():
                    samples.setdefault((tool, way), []).extend(await measure(call, calls))
    return samples


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def report(backend: str, samples: dict[tuple[str, str], list[float]], before: str) -> None:
    print(f"\n{backend} ({before} before, {load()} after)")
    print(f"{'tool':<18} {'way':<10} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8}   target (2 × route p50 + 1 ms)")
    for (tool, way), values in samples.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        route_p50 = statistics.median(samples[(tool, "route")])
        target = ""
        if way != "route" and tool in ("publish_decision", "send_message"):
            bound = 2 * route_p50 + 1
            target = f"p50 {p50:.2f} {'<=' if p50 <= bound else '>'} {bound:.2f}: {'met' if p50 <= bound else 'MISSED'}"
        print(f"{tool:<18} {way:<10} {len(values):>6} {p50:>8.2f} {p99:>8.2f}   {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="both", choices=("sqlite", "postgresql", "both"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=100)
    options = parser.parse_args()
    backends = ("sqlite", "postgresql") if options.backend == "both" else (options.backend,)
    for backend in backends:
        with harness.gateway(backend) as served:
            before = load()
            report(backend, asyncio.run(bench_backend(served, options.rounds, options.calls)), before)


if __name__ == "__main__":
    main()
