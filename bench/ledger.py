"""The Run ledger's cost (issue 41): the warm agent's round trip and Run throughput, with the
ledger (this checkout) against without (another checkout, such as the commit before it).

    python -m bench.ledger --against /tmp/before [--backend sqlite|postgresql|both] [--rounds 6]
                           [--samples 60] [--burst 200] [--clients 16]

Each backend gets two real gateways side by side (``bench.harness``: ``init``, then ``serve``;
the demo echo agent kept warm under the persistent runtime), measured in alternating rounds
(each goes first as often as the other), each round:

1. a User's inbound ``POST /messages`` → the echo answer readable, sequential (``bench.agent``):
   p50; target: the ledger adds at most 1 ms;
2. ``--burst`` Messages from ``--clients`` Users at once → all answered: answered per second,
   that is Runs per second; target: at least 95 % of without.

``/tmp/before`` is a checkout, or just its ``src``: ``git archive <commit> src | tar -x -C /tmp/before``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path

from bench import harness
from bench.agent import burst, sequential


def compare(backend: str, other: Path, rounds: int, samples: int, total: int, clients: int) -> None:
    if not (other / "src" / "agent_gateway").is_dir():
        raise SystemExit(f"--against {other}: not a checkout of agent-gateway (no src/agent_gateway)")
    env = {"AGENT_GATEWAY_RUNTIME_MODE": "persistent"}
    with harness.gateway(backend, env) as this, harness.gateway(backend, env, src=other / "src") as that:
        # Its operator commands (bench.messages.admit_with_token) run its own code too: this
        # checkout's would refuse its database, which is not migrated to the ledger's revision.
        that.env["PYTHONPATH"] = str(other / "src")
        gateways = {"ledger": this, "without": that}
        p50: dict[str, list[float]] = {name: [] for name in gateways}
        rate: dict[str, list[float]] = {name: [] for name in gateways}
        for number in range(rounds):
            for name in ("ledger", "without") if number % 2 == 0 else ("without", "ledger"):
                served = gateways[name]
                p50[name].append(statistics.median(asyncio.run(sequential(served, samples))))
                rate[name].append(asyncio.run(burst(served, total, clients))[0])
            print(
                f"[{backend}] round {number + 1}: "
                + "   ".join(f"{name} p50 {p50[name][-1]:5.2f} ms, {rate[name][-1]:6,.0f} Runs/s" for name in gateways)
            )
    added = statistics.median(p50["ledger"]) - statistics.median(p50["without"])
    per_round = sorted(a / b for a, b in zip(rate["ledger"], rate["without"], strict=True))
    print(
        f"[{backend}] over {rounds} alternating rounds: round trip p50 {statistics.median(p50['ledger']):.2f} ms "
        f"with the ledger, {statistics.median(p50['without']):.2f} ms without ({added:+.2f} ms); "
        f"Runs/s {sum(rate['ledger']) / sum(rate['without']):.1%} of without on the sums, median round "
        f"{statistics.median(per_round):.1%} ({per_round[0]:.0%}-{per_round[-1]:.0%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, required=True, help="the checkout without the ledger")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        compare(backend, args.against.resolve(), args.rounds, args.samples, args.burst, args.clients)


if __name__ == "__main__":
    main()
