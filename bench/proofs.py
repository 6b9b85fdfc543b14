"""``agent-gateway verify-proof`` on a log of 1,000,000 Decisions (issue 38), against one of 1,000.

    python -m bench.proofs --backend sqlite --large 1000000 --runs 10

Two served gateways, each with two witnesses listed (keys made here; nothing is sent to them:
their cosignatures are written here, as the collector writes them, so that the checkpoint is
witnessed at once). Their logs are filled in the set-up, not through the API (bench/transparency.py's
``fill``: every Decision signed by the deployment's key, the tree's nodes written with the rows),
one of 1,000 Decisions and one of ``--large``. From each, the tlog-proof of a Decision in the middle
of the log is fetched over HTTP (``GET /decisions/{seq}/proof?format=tlog-proof``); then, with no
gateway, no network and no database, ``agent-gateway verify-proof FILE --key VKEY --witness W1
--witness W2`` runs ``--runs`` times on each proof in alternating order (small, large, large,
small, ...): the median wall time of the command (an interpreter's start included), and the median
time of the verification alone (``transparency.proof.verify`` in this process, 1,000 times each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway.store.engine import Store
from agent_gateway.store.queries import witnesses as witness_queries
from agent_gateway.transparency import note, proof, witness
from bench import harness
from bench.transparency import SMALL, fill, signed_by
from tests.served import ServedGateway, cli_env

IN_PROCESS_RUNS = 1_000


def witness_key(name: str) -> tuple[ed25519.Ed25519PrivateKey, witness.WitnessKey]:
    private = ed25519.Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, witness.WitnessKey(name, public)


WITNESSES = [witness_key(f"w{n}.bench/w") for n in (1, 2)]


async def cosign(url: str, text: bytes) -> None:
    """Both witnesses' cosignatures of the checkpoint ``text``, written as the collector writes them."""
    timestamp = int(time.time())
    store = Store(url)
    try:
        async with store.transaction() as conn:
            for private, key in WITNESSES:
                signature = private.sign(witness.cosigned_message(text, timestamp))
                line = witness.Cosignature(key.name, key.key_id, timestamp, signature).line().decode().rstrip("\n")
                await witness_queries.DECISIONS.add(conn, witness=key.vkey(), tree_size=note.Checkpoint.parse(text).size, line=line)
    finally:
        await store.close()


def witnessed_proof(served: ServedGateway, size: int, directory: Path) -> tuple[Path, str]:
    """Fill ``served``'s log with ``size`` Decisions, witness its checkpoint; the proof file of the
    Decision in the middle, and the log's vkey."""
    url = served.env["AGENT_GATEWAY_DATABASE_URL"]
    seconds = fill(url, 1, size, signed_by(served.directory / "signing-key.pem"))
    print(f"filled {size:,} Decisions and their tree in {seconds:.0f} s")
    signed = httpx.get(f"{served.agent_url}/checkpoint", timeout=600).content
    asyncio.run(cosign(url, signed[: signed.index(b"\n\n") + 1]))
    response = httpx.get(f"{served.agent_url}/decisions/{size // 2}/proof?format=tlog-proof", timeout=600)
    response.raise_for_status()
    path = directory / f"proof-{size}.txt"
    path.write_bytes(response.content)
    return path, served.cli_json("keys", "show")["vkey"]


def verify_command(path: Path, vkey: str) -> list[str]:
    return [sys.executable, "-m", "agent_gateway", "verify-proof", str(path), "--key", vkey,
            *[arg for _, key in WITNESSES for arg in ("--witness", key.vkey())]]


def time_in_process(path: Path, vkey: str) -> float:
    parsed, key = proof.TlogProof.parse(path.read_bytes()), proof.gateway_key(vkey)
    witnesses = [key for _, key in WITNESSES]
    started = time.perf_counter()
    for _ in range(IN_PROCESS_RUNS):
        proof.verify(parsed, key, witnesses, len(witnesses))
    return (time.perf_counter() - started) / IN_PROCESS_RUNS


def run(backend: str, large: int, runs: int) -> None:
    # Unreachable (the discard port): the gateway's collector fails to send them anything.
    listed = json.dumps([{"url": f"http://127.0.0.1:9/{key.name}", "vkey": key.vkey()} for _, key in WITNESSES])
    env = {"AGENT_GATEWAY_TRANSPARENCY_WITNESSES": listed}
    with tempfile.TemporaryDirectory(prefix="agw-bench-proofs-") as tmp:
        directory = Path(tmp)
        proofs = {}
        for size in (SMALL, large):
            with harness.gateway(backend, env) as served:
                proofs[size] = witnessed_proof(served, size, directory)
        # Offline from here: the gateways are gone.
        command_env = cli_env(directory / "none.toml")
        command: dict[int, list[float]] = {SMALL: [], large: []}
        alone: dict[int, list[float]] = {SMALL: [], large: []}
        for number in range(runs):
            for size in (SMALL, large) if number % 2 == 0 else (large, SMALL):
                path, vkey = proofs[size]
                command[size].append(harness.time_command(verify_command(path, vkey), command_env))
                alone[size].append(time_in_process(path, vkey))
        for size in (SMALL, large):
            path, _ = proofs[size]
            hashes = len(proof.TlogProof.parse(path.read_bytes()).hashes)
            print(
                f"[{backend}] verify-proof on a log of {size:,} ({hashes} proof hashes, {runs} runs): "
                f"command {statistics.median(command[size]) * 1000:.0f} ms (median wall time), "
                f"the verification alone {statistics.median(alone[size]) * 1e6:.0f} us"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    run(args.backend, args.large, args.runs)


if __name__ == "__main__":
    main()
