"""A User's receipt (issue 41): what ``GET /messages/{seq}/receipt`` and ``verify-receipt`` cost.

    python -m bench.receipts [--backend sqlite|postgresql|both] [--messages 200] [--rounds 6] [--runs 10]

Each backend gets a real gateway (``bench.harness``: ``init``, then ``serve``; the demo echo
agent kept warm under the persistent runtime). One User sends ``--messages`` Messages, each
answered before the next (``bench.agent.one_answer``). Then, in alternating rounds (each read
first as often as the other), on one kept-alive connection (``bench.rawhttp``), sequentially:

1. ``GET /messages/{seq}/receipt`` of each of the User's inbound Messages (the Message, its
   Signal, its Run's entry, the instructions entry, two inclusion proofs, the checkpoint);
2. ``GET /ledger/entries/{seq}`` of as many entries (one entry and its proof: the ledger's own
   read, for scale);

each round's median latency. Then, with no gateway and no network, ``agent-gateway
verify-receipt`` on one receipt: the command's median wall time over ``--runs`` (an
interpreter's start included), and the verification alone in this process (``receipt.verify``),
1,000 times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agent_gateway.ledger import receipt
from agent_gateway.transparency import proof
from bench import harness, rawhttp
from bench.agent import ok, one_answer
from bench.messages import admit_with_token
from tests.served import ServedGateway, cli_env

IN_PROCESS_RUNS = 1_000
ECHO_TEXT = "ping {}"


async def fill(served: ServedGateway, auth: dict[str, str], count: int) -> list[int]:
    """The seqs of ``count`` inbound Messages, each answered."""
    async with rawhttp.Connection(served.public_url, auth) as public:
        await one_answer(public, served, ECHO_TEXT.format(0))
        for n in range(1, count):
            await one_answer(public, served, ECHO_TEXT.format(n))
        seqs, after = [], 0
        while page := ok(await public.get("/messages", {"after": str(after), "limit": "200"}), 200)["messages"]:
            seqs += [m["seq"] for m in page if m["direction"] == "inbound"]
            after = page[-1]["seq"]
    return seqs


async def latencies(served: ServedGateway, auth: dict[str, str], paths: list[str]) -> list[float]:
    """Milliseconds of each GET of ``paths``, one after the other."""
    async with rawhttp.Connection(served.public_url, auth) as public:
        measured = []
        for path in paths:
            started = time.perf_counter()
            ok(await public.get(path), 200)
            measured.append((time.perf_counter() - started) * 1000)
    return measured


async def body(served: ServedGateway, auth: dict[str, str], path: str) -> bytes:
    async with rawhttp.Connection(served.public_url, auth) as public:
        return json.dumps(ok(await public.get(path), 200)).encode()


def run(backend: str, count: int, rounds: int, runs: int) -> None:
    with harness.gateway(backend, {"AGENT_GATEWAY_RUNTIME_MODE": "persistent"}) as served:
        _, auth = admit_with_token(served)
        seqs = asyncio.run(fill(served, auth, count))
        reads = {
            "receipt": [f"/messages/{seq}/receipt" for seq in seqs],
            "ledger entry": [f"/ledger/entries/{number}" for number in range(1, len(seqs) + 1)],
        }
        p50: dict[str, list[float]] = {name: [] for name in reads}
        for number in range(rounds):
            for name in list(reads) if number % 2 == 0 else list(reads)[::-1]:
                p50[name].append(statistics.median(asyncio.run(latencies(served, auth, reads[name]))))
            print(f"[{backend}] round {number + 1}: " + "   ".join(f"{name} p50 {p50[name][-1]:.2f} ms" for name in reads))
        data = asyncio.run(body(served, auth, f"/messages/{seqs[len(seqs) // 2]}/receipt"))
        vkey = served.cli_json("keys", "show")["vkey"]
    text = ECHO_TEXT.format(len(seqs) // 2)
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        path = Path(tmp) / "receipt.json"
        path.write_bytes(data)
        env = cli_env(Path(tmp) / "none.toml")
        argv = [sys.executable, "-m", "agent_gateway", "verify-receipt", str(path), "--text", text, "--key", vkey]
        command = statistics.median(harness.time_command(argv, env) for _ in range(runs))
    parsed, key = receipt.parse(data), proof.gateway_key(vkey)
    started = time.perf_counter()
    for _ in range(IN_PROCESS_RUNS):
        receipt.verify(parsed, text, key)
    alone_ms = (time.perf_counter() - started) / IN_PROCESS_RUNS * 1000
    size = json.loads(data)["runs"][0]["treeSize"]
    print(
        f"[{backend}] {len(seqs)} Messages, a ledger of {size} entries: receipt p50 {statistics.median(p50['receipt']):.2f} ms, "
        f"ledger entry p50 {statistics.median(p50['ledger entry']):.2f} ms (medians of {rounds} rounds); "
        f"verify-receipt {command:.2f} s the command ({runs} runs), {alone_ms:.2f} ms the check alone; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        run(backend, args.messages, args.rounds, args.runs)


if __name__ == "__main__":
    main()
