"""The agent kept warm: the demo echo agent under the persistent runtime, as ``init --demo-user`` deploys it.

    python -m bench.agent [--backend sqlite|postgresql|both] [--samples 60] [--burst 300] [--clients 16] [--kills 3]
                          [--mode persistent|per-run] [--rounds N [--cpu]]

Each backend gets a fresh real gateway (``bench.harness``: ``init``, then
``serve``, one process), and prints:

1. a User's inbound ``POST /messages`` → the echo agent's answer readable with
   ``GET /messages?after=<seq>``, sequential: p50/p99 (target p50 ≤ 20 ms, p99 ≤ 50 ms);
2. ``--burst`` Messages sent at once by ``--clients`` Users (one client each) →
   all answered: answered per second (target ≥ 250/s on SQLite);
3. the agent process SIGKILLed between Runs → the next Message (sent once the
   agent is dead) answered: the time from the kill, over ``--kills`` rounds
   (target within 10 s).

The client is ``bench.rawhttp`` (kept-alive raw HTTP/1.1): httpx's CPU per
request, on the same two cores, bounded the burst more than the gateway did.
The burst ends at the last answer's ``createdAt`` (the gateway's clock, on
this host), so its poller may poll seldom: once every Message is sent, it asks
for the newest Signal every 0.1 s, then reads each User's log once.

``--mode per-run`` measures 1 and 2 with one echo process per Run instead, for comparison.

``--rounds N`` (with ``--backend both``) compares the backends' bursts instead: a gateway on
each, side by side, the burst measured on each in N alternating rounds (each goes first as
often as the other), so a machine whose speed drifts over minutes drifts under both alike; it
prints PostgreSQL's answered per second as a share of SQLite's, by the median round and on the
sums, with the interval the sums' ratio falls in when the rounds are resampled, and how long each
backend took to answer the burst's inbound ``POST``s (the Runs go on after, on PostgreSQL also
during). Each gateway takes one burst first, not counted (its connections opened, its statements
prepared). Its Users are admitted with the operator's Python API, so ``--clients 300 --burst 300``
is a burst of 300 Messages from 300 Users, one each. ``--cpu`` then also prints, for each backend,
the CPU each process used per Message over the measured bursts (``bench.cpu``): ``serve``, the
agent, this client, and on PostgreSQL each connection (named by its statement) and the server's
background processes; on two cores, what one backend spends more is what its burst waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench import cpu, harness, rawhttp
from bench.messages import admit_many, admit_with_token
from tests.served import ServedGateway

POLL_INTERVAL_S = 0.001
ANSWER_TIMEOUT_S = 60
BURST_POLL_S = 0.1
ECHO_MODULE = "agent_gateway.runtimes.echo"


def ok(answer: tuple[int, Any], *expected: int) -> Any:
    status, body = answer
    if status not in expected:
        raise SystemExit(f"answered {status}: {body}")
    return body


async def answered(public: rawhttp.Connection, served: ServedGateway, seq: int) -> None:
    """Poll the User's log after ``seq`` until the agent's answer is readable."""
    started = time.perf_counter()
    while True:
        page = ok(await public.get("/messages", {"after": str(seq)}), 200)
        if any(m["direction"] == "outbound" for m in page["messages"]):
            return
        if time.perf_counter() - started > ANSWER_TIMEOUT_S:
            raise SystemExit(f"no answer within {ANSWER_TIMEOUT_S}s; gateway log:\n{served.output()}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def one_answer(public: rawhttp.Connection, served: ServedGateway, text: str) -> float:
    """Milliseconds from sending one Message to its answer being readable."""
    started = time.perf_counter()
    sent = ok(await public.post("/messages", {"text": text}), 201)
    await answered(public, served, sent["seq"])
    return (time.perf_counter() - started) * 1000


async def sequential(served: ServedGateway, samples: int, auth: dict[str, str] | None = None) -> list[float]:
    """``samples`` round trips of one User's Messages (``auth``'s, or a User admitted now)."""
    if auth is None:
        _, auth = admit_with_token(served)
    async with rawhttp.Connection(served.public_url, auth) as public:
        await one_answer(public, served, "warm-up")  # the agent may still be starting
        return [await one_answer(public, served, f"ping {n}") for n in range(samples)]


class Burst(NamedTuple):
    """One burst's figures."""

    rate: float  # Messages answered per second, from the first sent to the last answer
    client_cpu_ms: float  # this client's own CPU per Message until drained (taken from the gateway's two cores)
    inbound_s: float  # from the first sent until every inbound POST was answered (201)


async def burst(
    served: ServedGateway, total: int, clients: int, users: list[tuple[str, dict[str, str]]] | None = None,
    accounts: cpu.Accounts | None = None,
) -> Burst:
    """``total`` Messages from ``clients`` Users at once (``users``, or Users admitted now), until
    every one is answered; ``accounts`` counts the gateway's CPU from the first sent until every
    Signal has ended (not the client's reads of the Users' logs before and after)."""
    if users is None:
        users = [admit_with_token(served) for _ in range(clients)]
    shares = [total // clients + (1 if n < total % clients else 0) for n in range(clients)]

    async def user_sends(auth: dict[str, str], count: int) -> None:
        async with rawhttp.Connection(served.public_url, auth) as public:
            for n in range(count):
                ok(await public.post("/messages", {"text": f"burst {n}"}), 201)

    async def drained(agent: rawhttp.Connection) -> None:
        """Return once every Signal has ended: the poller's own period and load change nothing
        measured (see :func:`last_answer`), so it asks only for the newest Signal (the worker
        takes them oldest first), every ``BURST_POLL_S``."""
        deadline = time.perf_counter() + ANSWER_TIMEOUT_S * 5
        while True:
            [newest] = ok(await agent.get("/signals", {"limit": "1"}), 200)["signals"]
            if newest["state"] not in ("pending", "processing"):
                return
            if time.perf_counter() > deadline:
                raise SystemExit(f"not all answered; gateway log:\n{served.output()}")
            await asyncio.sleep(BURST_POLL_S)

    async def last_answer(agent: rawhttp.Connection) -> datetime.datetime:
        """When the last answer was recorded (its ``createdAt``), read from each User's log past
        what it had seen, once the burst is over."""
        last = ""
        for (user_id, _), count in zip(users, shares):
            params = {"user": user_id, "after": str(seen[user_id]), "limit": "200"}
            answers = [m for m in ok(await agent.get("/messages", params), 200)["messages"] if m["direction"] == "outbound"]
            if len(answers) != count:
                raise SystemExit(f"{len(answers)} answers to {count} Messages of one User; gateway log:\n{served.output()}")
            last = max(last, *(answer["createdAt"] for answer in answers))
        return datetime.datetime.fromisoformat(last)

    async with rawhttp.Connection(served.agent_url) as agent:
        # Users of earlier bursts: only what comes after their logs' newest Message counts.
        seen: dict[str, int] = {}
        for user_id, _ in users:
            newest = ok(await agent.get("/messages", {"user": user_id, "limit": "1"}), 200)["messages"]
            seen[user_id] = newest[-1]["seq"] if newest else 0
        counted = accounts.start() if accounts is not None else {}
        started, client_cpu = datetime.datetime.now(datetime.UTC), time.process_time()
        # Every Message is sent before the poller looks: the newest Signal is then the burst's last.
        await asyncio.gather(*(user_sends(auth, count) for (_, auth), count in zip(users, shares)))
        inbound = datetime.datetime.now(datetime.UTC)
        await drained(agent)
        client_cpu = time.process_time() - client_cpu
        if accounts is not None:
            accounts.stop(counted)
        ended = await last_answer(agent)
    return Burst(total / (ended - started).total_seconds(), client_cpu * 1000 / total, (inbound - started).total_seconds())


def agent_pid(served: ServedGateway) -> int:
    """The echo agent process the gateway started (a child of ``serve``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == served.process.pid and ECHO_MODULE.encode() in cmdline:
            return int(entry.name)
    raise SystemExit("no echo agent process found under serve")


def dead(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie, or reaped already)."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped, even between opening and reading
        return True


async def runs_ended(agent: rawhttp.Connection) -> None:
    """Wait until no Run is running: the echo answers before its Run ends."""
    while True:
        runs = ok(await agent.get("/runs", {"limit": "1"}), 200)["runs"]
        if not runs or runs[0]["state"] in ("done", "failed"):
            return
        await asyncio.sleep(POLL_INTERVAL_S)


async def recovery(served: ServedGateway, rounds: int) -> list[float]:
    _, auth = admit_with_token(served)
    times = []
    async with rawhttp.Connection(served.public_url, auth) as public, rawhttp.Connection(served.agent_url) as agent:
        for n in range(rounds):
            await one_answer(public, served, f"before kill {n}")
            await runs_ended(agent)
            pid = agent_pid(served)
            killed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            # The next Message comes once the agent is dead: one racing the kill (SIGKILL is
            # delivered when the kernel next schedules the agent) may find its Run handed to
            # the dying agent, and that Run fails, as any Run in flight does.
            while not dead(pid):
                await asyncio.sleep(POLL_INTERVAL_S)
            await one_answer(public, served, f"after kill {n}")
            times.append((time.perf_counter() - killed) * 1000)
    return times


def bench(
    backend: str, samples: int, total: int, clients: int, kills: int, mode: str, env: dict[str, str] | None = None
) -> None:
    """Print the figures of one gateway (``env``: more of its settings; ``kills = 0`` skips recovery)."""
    with harness.gateway(backend, {"AGENT_GATEWAY_RUNTIME_MODE": mode, **(env or {})}) as served:
        delays = asyncio.run(sequential(served, samples))
        cuts = statistics.quantiles(delays, n=100, method="inclusive")
        print(
            f"{backend:<10} Message -> echo answer readable, sequential ({samples}): "
            f"p50 {cuts[49]:.1f} ms  p99 {cuts[98]:.1f} ms  max {max(delays):.1f} ms"
        )
        measured = asyncio.run(burst(served, total, clients))
        print(
            f"{backend:<10} {total} Messages at once from {clients} clients: {measured.rate:,.0f} answered/s "
            f"(every inbound POST answered after {measured.inbound_s * 1000:.0f} ms; this client's CPU: "
            f"{measured.client_cpu_ms:.1f} ms per Message)"
        )
        if mode == "per-run" or kills == 0:
            return
        times = asyncio.run(recovery(served, kills))
        print(
            f"{backend:<10} agent SIGKILLed between Runs -> next Message answered: "
            + ", ".join(f"{t / 1000:.2f} s" for t in times)
        )


def warm_up(
    gateways: dict[str, ServedGateway], total: int, clients: int, users: dict[str, list[tuple[str, dict[str, str]]]]
) -> None:
    """One burst on each gateway, not measured: a fresh process's first burst also opens its
    database connections and prepares its statements on each (on PostgreSQL its first answer
    came about a second later than in the bursts after it)."""
    for name, served in gateways.items():
        warm = asyncio.run(burst(served, total, clients, users[name][-clients:])).rate
        print(f"warm-up burst (not counted): {name} {warm:,.0f} answered/s")


def compare_backends(rounds: int, total: int, clients: int, mode: str, cpu_table: bool = False) -> None:
    """The burst on SQLite and on PostgreSQL in alternating rounds (see the module's docstring);
    ``cpu_table``: with each backend's CPU per Message, by process."""
    env = {"AGENT_GATEWAY_RUNTIME_MODE": mode}
    with harness.gateway("sqlite", env) as sqlite, harness.gateway("postgresql", env) as postgresql:
        gateways = {"sqlite": sqlite, "postgresql": postgresql}
        # Admitted once, with the Python API: two operator commands per User per round would take
        # most of a round's time, and minutes for hundreds of Users.
        users = {name: admit_many(served, clients) for name, served in gateways.items()}
        warm_up(gateways, total, clients, users)
        rate: dict[str, list[float]] = {name: [] for name in gateways}
        inbound_ms: dict[str, list[float]] = {name: [] for name in gateways}
        accounts = {name: cpu.Accounts(served) for name, served in gateways.items()}
        client_ms = dict.fromkeys(gateways, 0.0)
        for number in range(rounds):
            for name in ("sqlite", "postgresql") if number % 2 == 0 else ("postgresql", "sqlite"):
                measured = asyncio.run(burst(gateways[name], total, clients, users[name], accounts[name]))
                rate[name].append(measured.rate)
                inbound_ms[name].append(measured.inbound_s * 1000)
                client_ms[name] += measured.client_cpu_ms
            print(
                f"round {number + 1} (load {os.getloadavg()[0]:.1f}): "
                + "   ".join(
                    f"{name} {rate[name][-1]:6,.0f} answered/s (inbound {inbound_ms[name][-1]:4.0f} ms)" for name in gateways
                )
            )
        tables = {name: accounts[name].table(rounds * total) for name in gateways} if cpu_table else {}
    for name, table in tables.items():
        print(f"{name}: CPU per Message over the measured bursts, by process (ms)")
        for label, ms in [*table, ("this client (bench.rawhttp)", client_ms[name] / rounds)]:
            print(f"  {ms:6.3f}  {label}")
        print(f"  {sum(ms for _, ms in table) + client_ms[name] / rounds:6.3f}  in all")
    per_round = sorted(a / b for a, b in zip(rate["postgresql"], rate["sqlite"], strict=True))
    low, high = harness.interval(rate["postgresql"], rate["sqlite"])
    print(
        f"over {rounds} alternating rounds of {total} Messages from {clients} clients: PostgreSQL "
        f"{statistics.median(rate['postgresql']):,.0f}/s, SQLite {statistics.median(rate['sqlite']):,.0f}/s (medians); "
        f"PostgreSQL's median round {statistics.median(per_round):.1%} of SQLite's ({per_round[0]:.0%}-{per_round[-1]:.0%}), "
        f"{sum(rate['postgresql']) / sum(rate['sqlite']):.1%} on the sums ({low:.1%}-{high:.1%} in 95 % of "
        "resamplings of the rounds); every inbound POST answered after "
        f"{statistics.median(inbound_ms['postgresql']):.0f} ms on PostgreSQL, "
        f"{statistics.median(inbound_ms['sqlite']):.0f} ms on SQLite (medians)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--burst", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--mode", choices=["persistent", "per-run"], default="persistent")
    parser.add_argument("--rounds", type=int, help="compare the backends' bursts in this many alternating rounds")
    parser.add_argument("--cpu", action="store_true", help="with --rounds: each backend's CPU per Message, by process")
    args = parser.parse_args()
    if args.cpu and args.rounds is None:
        parser.error("--cpu accounts the CPU of a comparison: give --rounds")
    if args.rounds is not None:
        if args.backend != "both":
            parser.error("--rounds compares the two backends: give --backend both")
        compare_backends(args.rounds, args.burst, args.clients, args.mode, args.cpu)
        return
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        print(f"{backend:<10} runtime.mode = {args.mode!r}")
        bench(backend, args.samples, args.burst, args.clients, args.kills, args.mode)


if __name__ == "__main__":
    main()
