"""Scale-out on one PostgreSQL database: throughput with 1, 2 and 3 API processes, and worker failover.

    python -m bench.scaleout [--duration S] [--processes N] [--failovers N]

1. Aggregate ``GET /users/me`` throughput (a bearer Token: one indexed read of
   the database per request) with 1, 2, then 3 ``agent-gateway serve --role
   api`` processes, each on its own addresses, as separate hosts behind a load
   balancer would be. One ``wrk -t1 -c16`` runs per process, all at once, and
   their req/s are summed: the client load grows with the processes, as it
   would with more hosts. (``http.workers`` is the other way to use more cores:
   one ``serve`` forking HTTP processes onto one address, the kernel spreading
   connections; this measures separate ``serve`` processes, which is what runs
   on several hosts.) On a machine with few cores the wrk processes, the
   gateways and PostgreSQL share them, so the numbers show contention as much
   as scaling.
2. Worker failover: two ``serve --role api,worker`` processes; SIGKILL the one
   whose child ran the last Run (the leader), emit a Signal at once, and time
   until the standby's agent program starts its Run. Repeated ``--failovers``
   times, a fresh standby started each time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_gateway import deployment
from agent_gateway.auth import service as auth_service
from agent_gateway.signals import service as signals_service
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness
from tests.served import ServedGateway, free_port

KIND = "bench"
# The agent program of the failover measurement: note when it started and under which gateway.
AGENT = """\
import os, sys, time
with open(sys.argv[1], "a") as file:
    file.write(f"{time.time():.6f} {os.getppid()}\\n")
"""
WAIT_S = 60


def _spawn(directory: Path, url: str, roles: str, extra: dict[str, str] | None = None) -> ServedGateway:
    env = {
        "AGENT_GATEWAY_DATABASE_URL": url,
        "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{free_port()}",
        "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{free_port()}",
        "AGENT_GATEWAY_LOG_LEVEL": "WARNING",
        **(extra or {}),
    }
    return ServedGateway.spawn(directory, env, ("--role", roles))


async def _prepare(url: str) -> str:
    """Migrate (before any process starts: they would race to) and return a Token of a new User."""
    store = Store(url)
    try:
        await migrate.upgrade(store.engine)
        async with store.transaction() as conn:
            user = await users_service.admit(conn)
            return (await auth_service.issue_token(conn, user.id, ttl_ms=3_600_000)).token
    finally:
        await store.close()


def throughput(directory: Path, url: str, token: str, processes: int, duration: int) -> None:
    lua = harness.lua_request("GET", headers={"Authorization": f"Bearer {token}"})
    served: list[ServedGateway] = []
    print(f"GET /users/me, one wrk -t1 -c{harness.WRK_CONNECTIONS} -d{duration}s per `serve --role api` process")
    try:
        for count in range(1, processes + 1):
            served.append(_spawn(directory, url, "api"))
            harness.wrk(served[-1].public_url + "/users/me", lua, duration_s=1)  # warm the new process up
            with ThreadPoolExecutor(count) as pool:
                urls = [process.public_url + "/users/me" for process in served]
                done = list(pool.map(lambda url: harness.wrk(url, lua, duration_s=duration), urls))
            total = sum(result.requests_per_s for result in done)
            per_process = ", ".join(f"{result.requests_per_s:,.0f}" for result in done)
            worst_p99 = max(result.latency_ms.get("99", 0) for result in done)
            non_2xx = sum(result.non_2xx for result in done)
            rss = ", ".join(f"{harness.rss_mb(s.process.pid):.0f}" for s in served)
            print(
                f"  {count} process{'es' if count > 1 else '  '}: {total:>9,.0f} req/s in all ({per_process})   "
                f"worst p99 {worst_p99:6.2f} ms   non-2xx {non_2xx}   RSS MB {rss}"
            )
    finally:
        for process in served:
            process.stop()


def _runs(record: Path) -> list[tuple[float, int]]:
    if not record.exists():
        return []
    return [(float(at), int(ppid)) for at, ppid in (line.split() for line in record.read_text().splitlines())]


async def _emit(store: Store) -> None:
    async with store.transaction() as conn:
        await signals_service.emit(conn, KIND, {})


def _wait_for_run(record: Path, count: int) -> tuple[float, int]:
    deadline = time.monotonic() + WAIT_S
    while len(runs := _runs(record)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"no Run started within {WAIT_S}s")
        time.sleep(0.005)
    return runs[count - 1]


async def failover(directory: Path, url: str, rounds: int) -> None:
    agent, record = directory / "agent.py", directory / "runs.log"
    agent.write_text(AGENT)
    extra = {
        "AGENT_GATEWAY_RUNTIME_MODE": "per-run",  # init configures the persistent runtime
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, str(agent), str(record)]),
        "AGENT_GATEWAY_HANDLERS": json.dumps({KIND: {"template": "run"}}),
    }
    store = Store(url)
    served = [_spawn(directory, url, "api,worker", extra) for _ in range(2)]
    times: list[float] = []
    try:
        await _emit(store)
        _, leader_pid = await asyncio.to_thread(_wait_for_run, record, 1)
        for _ in range(rounds):
            [leader] = [s for s in served if s.process.pid == leader_pid]
            leader.process.send_signal(signal.SIGKILL)
            killed_at = time.time()
            leader.process.wait()
            served.remove(leader)
            await _emit(store)
            started_at, leader_pid = await asyncio.to_thread(_wait_for_run, record, len(_runs(record)) + 1)
            times.append(started_at - killed_at)
            served.append(_spawn(directory, url, "api,worker", extra))  # the next standby
    finally:
        await store.close()
        for process in served:
            process.stop()
    shown = ", ".join(f"{t:.2f}" for t in times)
    print(f"worker failover (SIGKILL of the leader to the standby's next Run starting), {rounds} rounds")
    print(f"  median {statistics.median(times):.2f} s   max {max(times):.2f} s   ({shown})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        directory = Path(tmp) / "deployment"
        deployment.write(directory)
        with harness.database("postgresql", Path(tmp)) as url:
            token = asyncio.run(_prepare(url))
            throughput(directory, url, token, args.processes, args.duration)
            asyncio.run(failover(directory, url, args.failovers))


if __name__ == "__main__":
    main()
