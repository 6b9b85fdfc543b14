"""A connection flood of the Public server, and the Agent server's latency meanwhile.

A real ``serve`` whose process may hold 1,024 descriptors; 3,000 idle connections
(opened, nothing sent) and 500 slowloris ones (a header line every 5 s) on its
Public server. Reports the Agent server's ``GET /decisions`` latency before and
during the flood, how long the server took to close every flood connection, and
whether both servers answer afterwards. Loopback only; bounded counts and times.

    python -m bench.flood [--backend sqlite|postgresql] [--idle 3000] [--slow 500]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness import database
from tests import served
from tests.flood import Flood

CEILING_S = 120


def latencies(url: str, count: int) -> list[float]:
    """``count`` sequential requests on one keep-alive connection; milliseconds each."""
    taken = []
    with httpx.Client(base_url=url, timeout=CEILING_S) as client:
        for _ in range(count):
            start = time.perf_counter()
            assert client.get("/decisions").status_code == 200
            taken.append((time.perf_counter() - start) * 1000)
            time.sleep(0.02)
    return taken


def summary(taken: list[float]) -> str:
    cuts = statistics.quantiles(taken, n=100)
    return f"p50 {cuts[49]:.1f} ms, p99 {cuts[98]:.1f} ms, max {max(taken):.1f} ms over {len(taken)} requests"


def flood(gateway: served.ServedGateway, idle: int, slow: int) -> None:
    host, port = gateway.public_url.removeprefix("http://").rsplit(":", 1)
    started = time.monotonic()
    with Flood(host, int(port), idle=idle, slow=slow, interval_s=5) as connections:
        print(f"flood of {idle} idle + {slow} slowloris connections opened in {time.monotonic() - started:.1f} s")
        print(f"Agent server during the flood: {summary(latencies(gateway.agent_url, 500))}")
        left = connections.wait_closed(CEILING_S)
        print(
            f"flood closed by the server {time.monotonic() - started:.1f} s after it began"
            if not left
            else f"{left} flood connections still open after {CEILING_S} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--idle", type=int, default=3000)
    parser.add_argument("--slow", type=int, default=500)
    options = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds the flood
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp, database(options.backend, Path(tmp)) as url:
        with served.ServedGateway.start(Path(tmp) / "deployment", url, descriptors=1024) as gateway:
            print(next(line for line in gateway.output().splitlines() if "file descriptors" in line))
            print(f"Agent server before the flood: {summary(latencies(gateway.agent_url, 200))}")
            flood(gateway, options.idle, options.slow)
            print(f"Agent server after the flood: {summary(latencies(gateway.agent_url, 200))}")
            public = httpx.get(f"{gateway.public_url}/jwks.json", timeout=CEILING_S).status_code
            print(f"Public server after the flood: GET /jwks.json {public}")


if __name__ == "__main__":
    main()
