"""The Run ledger's cost (issue 41): the warm agent's round trip and Run throughput, with the
ledger against without.

    python -m bench.ledger [--backend sqlite|postgresql|both] [--rounds 10] [--samples 40]
                           [--burst 150] [--clients 16] [--checkpoint-every S] [--against /tmp/before]

"Without" is this checkout with the ledger's Run entries left out (``bench/ledger_off``: the same
code, schema and transactions, ``Ledger.started`` doing nothing), so the two differ by the
ledger's write alone; ``--against`` compares with another checkout instead (or just its ``src``:
``git archive <commit> src | tar -x -C /tmp/before``), which differs by everything between them.

Each backend gets two real gateways side by side (``bench.harness``: ``init``, then ``serve``;
the demo echo agent kept warm under the persistent runtime), measured in alternating rounds
(each goes first as often as the other), after one burst on each that is not counted
(``bench.agent.warm_up``), each round:

1. a User's inbound ``POST /messages`` → the echo answer readable, sequential (``bench.agent``):
   p50; target: the ledger adds at most 1 ms;
2. ``--burst`` Messages from ``--clients`` Users at once → all answered: answered per second,
   that is Runs per second, and the CPU the gateway's processes (``serve`` and its children,
   the agent included, from ``/proc``) spent per Run; target: at least 95 % of the Runs per
   second without.

The ledger's tree grows after its entries are written (``store.queries.tree.Tree.integrate``):
when the Signal Worker has found the queue empty for half a second, which a burst never leaves
it, and before anything reads the tree. ``--checkpoint-every S`` reads the ledger's checkpoint
every ``S`` seconds through each burst, on both sides, as a witness's collector or an auditor
would, so that the tree's growth is in the Runs per second measured.

On a shared machine a round's figures swing with the other work: the summary takes the median
of the rounds and the ratio of their sums, with the interval the sums' ratio falls in when the
rounds are resampled (a bootstrap: what the swings leave uncertain), and the CPU per Run says
what the ledger's write costs the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx

from bench import harness
from bench.agent import Burst, burst, sequential, warm_up
from bench.messages import admit_with_token
from tests.served import SRC, ServedGateway

# Put before src on a gateway's PYTHONPATH: its sitecustomize leaves the Run entries out.
LEDGER_OFF = Path(__file__).resolve().parent / "ledger_off"


def compare(
    backend: str, other: Path | None, rounds: int, samples: int, total: int, clients: int, every: float | None
) -> None:
    env = {"AGENT_GATEWAY_RUNTIME_MODE": "persistent"}
    if other is None:
        without_src = SRC
        without_env = {**env, "PYTHONPATH": os.pathsep.join([str(LEDGER_OFF), str(SRC), os.environ.get("PYTHONPATH", "")])}
    else:
        if not (other / "src" / "agent_gateway").is_dir():
            raise SystemExit(f"--against {other}: not a checkout of agent-gateway (no src/agent_gateway)")
        without_src, without_env = other / "src", env
    with harness.gateway(backend, env) as this, harness.gateway(backend, without_env, src=without_src) as that:
        # Its operator commands (bench.messages.admit_with_token) run its own code too: another
        # checkout's database is not at this checkout's revision.
        that.env["PYTHONPATH"] = without_env.get("PYTHONPATH", str(without_src))
        gateways = {"ledger": this, "without": that}
        # Admitted once: an operator command per User per round took most of a round's time.
        users = {name: [admit_with_token(served) for _ in range(clients + 1)] for name, served in gateways.items()}
        warm_up(gateways, total, clients, users)
        p50: dict[str, list[float]] = {name: [] for name in gateways}
        rate: dict[str, list[float]] = {name: [] for name in gateways}
        cpu_ms: dict[str, list[float]] = {name: [] for name in gateways}
        for number in range(rounds):
            for name in ("ledger", "without") if number % 2 == 0 else ("without", "ledger"):
                served = gateways[name]
                p50[name].append(statistics.median(asyncio.run(sequential(served, samples, users[name][0][1]))))
                before = harness.tree_cpu_s(served.process.pid)
                rate[name].append(asyncio.run(read_during(burst(served, total, clients, users[name][1:]), served, every)).rate)
                cpu_ms[name].append((harness.tree_cpu_s(served.process.pid) - before) * 1000 / total)
            print(
                f"[{backend}] round {number + 1} (load {os.getloadavg()[0]:.1f}): "
                + "   ".join(
                    f"{name} p50 {p50[name][-1]:5.2f} ms, {rate[name][-1]:6,.0f} Runs/s, {cpu_ms[name][-1]:5.2f} ms CPU/Run"
                    for name in gateways
                )
            )
        # What was compared: every Run entered with the ledger, none without (with ledger_off).
        sizes = {name: ledger_size(served) for name, served in gateways.items()}
        if sizes["ledger"] <= rounds * total or (other is None and sizes["without"] != 1):
            raise SystemExit(f"the ledgers hold {sizes} entries: not the comparison intended")
    added = statistics.median(p50["ledger"]) - statistics.median(p50["without"])
    per_round = sorted(a / b for a, b in zip(rate["ledger"], rate["without"], strict=True))
    low, high = harness.interval(rate["ledger"], rate["without"])
    cpu_with, cpu_without = statistics.median(cpu_ms["ledger"]), statistics.median(cpu_ms["without"])
    print(
        f"[{backend}] over {rounds} alternating rounds: round trip p50 {statistics.median(p50['ledger']):.2f} ms "
        f"with the ledger, {statistics.median(p50['without']):.2f} ms without ({added:+.2f} ms); "
        f"Runs/s median round {statistics.median(per_round):.1%} of without ({per_round[0]:.0%}-{per_round[-1]:.0%}), "
        f"{sum(rate['ledger']) / sum(rate['without']):.1%} on the sums ({low:.1%}-{high:.1%} in 95 % of resamplings "
        f"of the rounds); CPU per Run {cpu_with:.2f} ms with, "
        f"{cpu_without:.2f} ms without ({cpu_without / cpu_with:.1%} of with: the Runs/s the CPU allows)"
    )


async def read_during(measured: Coroutine[Any, Any, Burst], served: ServedGateway, every: float | None) -> Burst:
    """``measured``, with the ledger's checkpoint read every ``every`` seconds meanwhile (None: never)."""
    if every is None:
        return await measured

    async def read() -> None:
        async with httpx.AsyncClient(base_url=served.agent_url, timeout=60) as client:
            while True:
                await asyncio.sleep(every)
                (await client.get("/ledger/checkpoint")).raise_for_status()

    reader = asyncio.create_task(read())
    try:
        return await measured
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


def ledger_size(served: ServedGateway) -> int:
    return int(httpx.get(f"{served.agent_url}/ledger/checkpoint", timeout=60).text.split("\n")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout to compare with (default: this one without the ledger)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--burst", type=int, default=150)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=float, help="read the ledger's checkpoint every S seconds during bursts")
    args = parser.parse_args()
    other = args.against.resolve() if args.against is not None else None
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        compare(backend, other, args.rounds, args.samples, args.burst, args.clients, args.checkpoint_every)


if __name__ == "__main__":
    main()
