"""What confinement (runtime.sandbox, bubblewrap) costs, confined against unconfined, in alternating rounds.

    python -m bench.sandbox [--rounds 3] [--starts 40] [--requests 400] [--samples 60] [--burst 300]
                            [--backend sqlite|postgresql|both]

1. Per-run start-up: one Run of the command runtime whose program is
   ``/usr/bin/true`` (so nothing but the start is measured), ``--starts`` Runs
   per round: p50/p99 per Run, unconfined and confined.
2. The Agent-server path: a Python program makes ``--requests`` sequential
   requests (kept alive) to ``$AGENT_SERVER_URL`` of a served gateway
   (``GET /runs?limit=1``), unconfined (straight to the Agent server) and
   confined (through the sandbox's forwarder and the gateway's relay): p50/p99
   per request, and the difference at p50 (the issue's budget: 1 ms).
3. The warm agent (``bench.agent``: the demo echo agent, persistent) with
   ``runtime.sandbox = "none"`` and ``"bubblewrap"``, on each backend:
   Message → echo answer p50/p99, and a burst of ``--burst`` Messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_gateway import config
from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.sandbox import choose
from agent_gateway.sandbox.bubblewrap import Sandbox
from agent_gateway.store.queries.runs import Run
from bench import agent, harness

# The program of part 2: sequential kept-alive requests to the Agent server, milliseconds each as JSON.
CLIENT = """
import http.client, json, os, sys, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["AGENT_SERVER_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port)
times = []
for n in range(int(sys.argv[1]) + 20):
    started = time.perf_counter()
    conn.request("GET", "/runs?limit=1")
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    if n >= 20:  # the first requests warm the connection up
        times.append((time.perf_counter() - started) * 1000)
print(json.dumps(times))
"""


def cuts(values: list[float]) -> tuple[float, float]:
    quantiles = statistics.quantiles(values, n=100, method="inclusive")
    return quantiles[49], quantiles[98]


def sandbox_for(workdir: Path, agent_listen: config.Address) -> Sandbox:
    settings = config.Settings(
        token_ttl_ms=1, runtime_sandbox="bubblewrap", runtime_workdir=workdir, agent_listen=agent_listen
    )
    sandbox = choose.choose(settings, agent_listen)
    assert sandbox is not None
    return sandbox


async def starts(workdir: Path, count: int, sandbox: Sandbox | None) -> list[float]:
    runtime = CommandRuntime(["true"], agent_server_url="http://127.0.0.1:1", workdir=workdir, sandbox=sandbox)
    times = []
    try:
        for n in range(count):
            run = Run(f"r-{n}", "s-1", None, "", "running", None, "2026-01-01T00:00:00.000Z", None)
            started = time.perf_counter()
            await runtime.run(run)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await runtime.close()
    return times


async def agent_path(agent_url: str, requests: int, sandbox: Sandbox | None, workdir: Path) -> list[float]:
    argv = [sys.executable, "-c", CLIENT, str(requests)]
    env = {"AGENT_SERVER_URL": agent_url, "PATH": "/usr/bin:/bin"}
    if sandbox is not None:
        await sandbox.prepare()
        env = sandbox.environment(env, workdir)
        argv = sandbox.wrap(argv, env, workdir)
    process = await asyncio.create_subprocess_exec(*argv, env=env, stdout=subprocess.PIPE)
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the client exited with {process.returncode}")
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--burst", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agw-bench-sandbox-") as tmp:
        workdir = Path(tmp) / "workspace"
        workdir.mkdir()
        sandbox = sandbox_for(workdir, config.Address("127.0.0.1", 1))
        measured: dict[str, list[float]] = {"unconfined": [], "confined": []}
        for _ in range(args.rounds):
            for label, confinement in (("unconfined", None), ("confined", sandbox)):
                measured[label] += asyncio.run(starts(workdir, args.starts, confinement))
        for label, times in measured.items():
            p50, p99 = cuts(times)
            print(f"per-run start of /usr/bin/true, {label:<10} ({len(times)} Runs): p50 {p50:.1f} ms  p99 {p99:.1f} ms")

        with harness.gateway("sqlite") as served:
            listen = config.Address("127.0.0.1", int(served.agent_url.rsplit(":", 1)[1]))
            path_sandbox = sandbox_for(workdir, listen)
            measured = {"unconfined": [], "confined": []}

            async def rounds() -> None:
                try:
                    for _ in range(args.rounds):
                        for label, confinement in (("unconfined", None), ("confined", path_sandbox)):
                            measured[label] += await agent_path(served.agent_url, args.requests, confinement, workdir)
                finally:
                    await path_sandbox.close()

            asyncio.run(rounds())
        figures = {label: cuts(times) for label, times in measured.items()}
        for label, (p50, p99) in figures.items():
            print(f"Agent server GET /runs?limit=1, {label:<10} ({len(measured[label])}): p50 {p50:.2f} ms  p99 {p99:.2f} ms")
        print(f"Agent-server path added by the sandbox at p50: {figures['confined'][0] - figures['unconfined'][0]:.2f} ms")

    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        for round_ in range(args.rounds):
            for mode in ("none", "bubblewrap"):
                print(f"{backend:<10} round {round_ + 1}, runtime.sandbox = {mode!r}")
                agent.bench(
                    backend, args.samples, args.burst, args.clients, 0, "persistent",
                    {"AGENT_GATEWAY_RUNTIME_SANDBOX": mode},
                )


if __name__ == "__main__":
    main()
