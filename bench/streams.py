"""Message streams (issue 13): delivery time, the cost of idle streams, answers over the stream.

    python -m bench.streams --backend sqlite
    python -m bench.streams --backend postgresql --streams 5000

Each part starts a fresh real gateway (``bench.harness``, one process):

1. delivery: an outbound ``POST /messages`` on the Agent server, timed from
   the moment it is sent to the moment its event is read off the User's open
   stream, p50/p99 over 1,000 sequential Messages;
2. scale of waiting: N idle streams of N distinct Users held open in the one
   process (raw sockets, each read and discarded): the resident memory they
   add per stream, the delivery p99 to one of them meanwhile, and
   ``GET /users/me`` throughput (wrk) and the server's CPU per request with
   and without them, in rounds that alternate (``--rounds``: without, with,
   with, without, ...), each run printed, then the means of each side;
3. answers: inbound ``POST /messages`` to the demo echo agent's answer read
   on the stream, p50/p99 (``bench.messages`` prints the same through polling).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent_gateway.auth import service as auth_service
from agent_gateway.store.engine import Store
from agent_gateway.users import service as users_service
from bench import harness
from bench.messages import ECHO, NO_HANDLERS, measure_answers
from tests.served import ServedGateway

DELIVERIES = 1_000
SCALE_DELIVERIES = 200
ANSWERS = 40
TIMEOUT = httpx.Timeout(60.0, read=None)


def cuts(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49]:7.2f} ms   p99 {q[98]:7.2f} ms   ({len(samples)} samples)"


async def admit(database_url: str, count: int) -> list[tuple[str, str]]:
    """``count`` Users and a Token each, written straight to the database (minutes through the CLI)."""
    store = Store(database_url)
    admitted = []
    try:
        for start in range(0, count, 500):
            async with store.transaction() as conn:
                for _ in range(min(500, count - start)):
                    user = await users_service.admit(conn)
                    token = (await auth_service.issue_token(conn, user.id, ttl_ms=3_600_000)).to_json()["token"]
                    admitted.append((user.id, token))
    finally:
        await store.close()
    return admitted


class Follower:
    """One open stream, read event by event."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next_seq(self) -> int:
        async for line in self.lines:
            if line.startswith("id: "):
                return int(line[4:])
        raise RuntimeError("the stream ended")


async def deliveries(served: ServedGateway, user_id: str, token: str, count: int) -> list[float]:
    """Milliseconds from sending each outbound Message to reading its event.

    This client's garbage collector is off while it measures: one of its full
    collections took 67 ms, which a sample would have counted as the server's.
    """
    samples = []
    async with httpx.AsyncClient(timeout=TIMEOUT) as reader, httpx.AsyncClient(timeout=TIMEOUT) as writer:
        headers = {"Authorization": f"Bearer {token}"}
        async with reader.stream("GET", f"{served.public_url}/messages/stream", headers=headers) as response:
            follower = Follower(response)
            gc.collect()
            gc.disable()
            try:
                for n in range(count):
                    started = time.perf_counter()
                    post = asyncio.create_task(
                        writer.post(f"{served.agent_url}/messages", json={"userId": user_id, "text": f"m{n}"})
                    )
                    await follower.next_seq()
                    samples.append((time.perf_counter() - started) * 1000)
                    assert (await post).status_code == 201
            finally:
                gc.enable()
    return samples


async def hold_idle_streams(served: ServedGateway, admitted: list[tuple[str, str]]) -> list[asyncio.Task[None]]:
    """Open a stream per (User, Token) on a raw socket; each task reads and discards until cancelled."""
    host, port = served.public_url.removeprefix("http://").rsplit(":", 1)
    opened: list[asyncio.Future[None]] = []

    async def hold(token: str, ready: asyncio.Future[None]) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /messages/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        head = await reader.readuntil(b": keep-alive\n\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        ready.set_result(None)
        try:
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    tasks = []
    for _, token in admitted:
        ready = asyncio.get_running_loop().create_future()
        opened.append(ready)
        tasks.append(asyncio.create_task(hold(token, ready)))
        if len(tasks) % 200 == 0:
            await asyncio.gather(*opened[-200:])
    await asyncio.gather(*opened)
    return tasks


def users_me(served: ServedGateway, token: str, duration: int, profile: Path | None = None) -> tuple[harness.WrkResult, float]:
    """wrk on ``GET /users/me``, and the server's CPU per request in microseconds (``harness.wrk_cpu``).

    With ``profile``, py-spy samples the server meanwhile into that file (its raw,
    collapsed-stack format).
    """
    lua = harness.lua_request("GET", None, {"Authorization": f"Bearer {token}"})
    spy = None
    if profile is not None:
        command = [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(served.process.pid), "-f", "raw", "-o", str(profile), "-d", str(duration)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return harness.wrk_cpu(served.process.pid, f"{served.public_url}/users/me", lua, duration_s=duration)
    finally:
        if spy is not None:
            spy.wait()


def round_order(rounds: int) -> list[bool]:
    """Whether each wrk run has the streams open, in pairs that alternate their order
    (without, with, with, without, ...), so that a drift of the shared machine's load
    weighs on both sides alike."""
    return [open_ for pair in range(rounds) for open_ in ((False, True) if pair % 2 == 0 else (True, False))]


def measure_scale(backend: str, count: int, duration: int, rounds: int, profiles: Path | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with harness.gateway(backend, NO_HANDLERS) as served:  # enters with asyncio.run: outside the loop
        asyncio.run(_measure_scale(served, count, duration, rounds, profiles))


async def _measure_scale(served: ServedGateway, count: int, duration: int, rounds: int, profiles: Path | None) -> None:
    admitted = await admit(served.env["AGENT_GATEWAY_DATABASE_URL"], count + 1)
    (probe_id, probe_token), idle = admitted[0], admitted[1:]
    # Warm up the process (first requests, pools) before the first round.
    await deliveries(served, probe_id, probe_token, 50)
    await asyncio.to_thread(users_me, served, probe_token, 2)
    tasks: list[asyncio.Task[None]] = []
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for n, open_ in enumerate(round_order(rounds), 1):
        if open_ and not tasks:
            before = harness.rss_mb(served.process.pid)
            tasks = await hold_idle_streams(served, idle)
            await asyncio.sleep(2)
            if not runs[True]:  # the first opening: memory, and delivery beside them
                added_kb = (harness.rss_mb(served.process.pid) - before) * 1024 / count
                print(f"{count:,} idle streams open: {added_kb:.1f} KB of resident memory added per stream")
                samples = await deliveries(served, probe_id, probe_token, SCALE_DELIVERIES)
                print(f"{'delivery to one User beside them':<44} {cuts(samples)}")
        elif not open_ and tasks:
            await close_streams(tasks)
            tasks = []
            await asyncio.sleep(2)  # the server notices each connection go
        profile = None if profiles is None else profiles / f"run-{n}-{'with' if open_ else 'without'}-streams.txt"
        result, cpu_us = await asyncio.to_thread(users_me, served, probe_token, duration, profile)
        runs[open_].append((result.requests_per_s, cpu_us))
        label = f"run {n}: GET /users/me, " + (f"{count:,} streams open" if open_ else "no stream open")
        print(result.line(label) + f"   {cpu_us:4.0f} us CPU/req   load {os.getloadavg()[0]:.2f}")
    await close_streams(tasks)
    rps = {open_: statistics.mean(r for r, _ in runs[open_]) for open_ in runs}
    cpu = {open_: statistics.mean(c for _, c in runs[open_]) for open_ in runs}
    print(
        f"GET /users/me with {count:,} streams against without, over {rounds} rounds: "
        f"{rps[False]:,.0f} -> {rps[True]:,.0f} req/s ({(rps[True] / rps[False] - 1) * 100:+.1f} %), "
        f"CPU/req {cpu[False]:.0f} -> {cpu[True]:.0f} us ({(cpu[True] / cpu[False] - 1) * 100:+.1f} %)"
    )


async def close_streams(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def measure_answers_on_stream(backend: str) -> None:
    with harness.gateway(backend, ECHO) as served:
        asyncio.run(_measure_answers_on_stream(served))


async def _measure_answers_on_stream(served: ServedGateway) -> None:
    [(user_id, token)] = await admit(served.env["AGENT_GATEWAY_DATABASE_URL"], 1)
    headers = {"Authorization": f"Bearer {token}"}
    samples = []
    async with httpx.AsyncClient(timeout=TIMEOUT) as reader, httpx.AsyncClient(timeout=TIMEOUT) as writer:
        async with reader.stream("GET", f"{served.public_url}/messages/stream", headers=headers) as response:
            follower = Follower(response)
            for n in range(ANSWERS):
                started = time.perf_counter()
                sent = await writer.post(f"{served.public_url}/messages", json={"text": f"q{n}"}, headers=headers)
                assert sent.status_code == 201, sent.text
                while await follower.next_seq() != sent.json()["seq"] + 1:
                    pass
                samples.append((time.perf_counter() - started) * 1000)
    print(f"{'inbound POST -> echo answer on the stream':<44} {cuts(samples)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--streams", type=int, default=5_000, help="idle streams held open (distinct Users)")
    parser.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of wrk runs without and with the streams")
    parser.add_argument("--profile", type=Path, help="py-spy each GET /users/me run of the scale part into this folder")
    parser.add_argument("--parts", default="delivery,scale,answers", help="which parts to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"backend {args.backend}, one gateway process")
    if "delivery" in parts:
        with harness.gateway(args.backend, NO_HANDLERS) as served:
            [(user_id, token)] = asyncio.run(admit(served.env["AGENT_GATEWAY_DATABASE_URL"], 1))
            asyncio.run(deliveries(served, user_id, token, 50))  # warm-up
            samples = asyncio.run(deliveries(served, user_id, token, DELIVERIES))
            print(f"{'outbound POST (Agent) -> event on the stream':<44} {cuts(samples)}")
    if "scale" in parts:
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        measure_scale(args.backend, args.streams, args.duration, args.rounds, args.profile)
    if "answers" in parts:
        measure_answers_on_stream(args.backend)
        measure_answers(args.backend)  # the same through polling, for comparison


if __name__ == "__main__":
    main()
