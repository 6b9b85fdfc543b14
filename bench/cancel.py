"""Cancelling a Run: how soon the queue moves on, and what watching for cancels costs the worker.

    python -m bench.cancel [--backend sqlite|postgresql|both] [--samples N]
    python -m bench.cancel --against /tmp/before [--rounds N] [--backend ...]

- cancel → next Run: a Signal whose agent program hangs is running; another Store
  (as the CLI is another process) cancels its Run; timed from that transaction's
  commit to the next Signal's Run being recorded started. Per-run runtime (the
  program's process group gets SIGTERM) and persistent runtime (the program is
  stopped and a fresh one started for the next Run). The program honours SIGTERM.
- with ``--against DIR``: ``bench.signals``'s emit → Run-start latency and in-process
  drain rate with this checkout's code and with the one in DIR (say the commit before
  cancelling existed: ``git archive 20da1b1 src | tar -x -C /tmp/before``), in
  alternating rounds on one machine: the cost of the watcher every Run now has.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from agent_gateway import clock, config
from agent_gateway.gateway import Gateway
from agent_gateway.signals import service
from agent_gateway.signatures import keys
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store
from bench import harness
from bench.signals import percentile

KIND = "bench"
SIGNING_KEY = keys.generate_pem("ed25519").decode()
# Per-run: hangs on the Prompt "hang", else exits at once.
PER_RUN_AGENT = "import sys, time\nif sys.stdin.read() == 'hang':\n    time.sleep(3600)\n"
# Persistent: never answers "hang", answers anything else done at once.
PERSISTENT_AGENT = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    run = json.loads(line)['run']\n"
    "    if run['prompt'] != 'hang':\n"
    "        sys.stdout.write(json.dumps({'type': 'done', 'run': run['id']}) + '\\n')\n"
    "        sys.stdout.flush()\n"
)
ROOT = Path(__file__).resolve().parents[1]


async def _runs(store: Store, signal_id: str) -> list:
    async with store.read() as conn:
        return await service.list_runs(conn, 10, signal_id)


async def _wait(condition) -> None:  # type: ignore[no-untyped-def]
    while not await condition():
        await asyncio.sleep(0.005)


async def cancel_to_next(url: str, workdir: Path, mode: str, samples: int) -> list[float]:
    """Milliseconds from each cancel's commit to the next Signal's Run start."""
    agent = PER_RUN_AGENT if mode == "per-run" else PERSISTENT_AGENT
    settings = config.Settings(
        token_ttl_ms=3_600_000, database_url=url, signing_key_pem=SIGNING_KEY,
        runtime_command=(sys.executable, "-c", agent), runtime_mode=mode, runtime_workdir=workdir,
        handlers={KIND: {"template": "{{ what }}"}},
    )
    gateway = Gateway(settings)
    await gateway.start(migrate_first=False)
    operator = Store(url)
    delays = []
    try:
        for _ in range(samples):
            async with gateway.store.transaction() as conn:
                stuck = await service.emit(conn, KIND, {"what": "hang"})
                following = await service.emit(conn, KIND, {"what": "ok"})

            async def running() -> bool:
                return [run.state for run in await _runs(gateway.store, stuck)] == ["running"]

            await _wait(running)
            await asyncio.sleep(0.3)  # the program is up and hanging
            [run] = await _runs(gateway.store, stuck)
            async with operator.transaction() as conn:
                await service.cancel_run(conn, run.id)
            committed = clock.now()

            async def moved_on() -> bool:
                return any(run.started_at for run in await _runs(gateway.store, following))

            await _wait(moved_on)
            [next_run] = await _runs(gateway.store, following)
            delays.append((clock.parse_instant(next_run.started_at) - committed).total_seconds() * 1000)

            async def ended() -> bool:
                return all(run.state == "done" for run in await _runs(gateway.store, following))

            await _wait(ended)
        return delays
    finally:
        await operator.close()
        await gateway.stop()


def latency_bench(backend: str, samples: int) -> None:
    for mode in ("per-run", "persistent"):
        with tempfile.TemporaryDirectory(prefix="agw-bench-cancel-") as tmp:
            directory = Path(tmp)
            with harness.database(backend, directory) as url:
                asyncio.run(migrate.upgrade_url(url))
                delays = uvloop.run(cancel_to_next(url, directory / "ws", mode, samples))
        print(
            f"{backend:<10} cancel commit → next Run start, {mode} runtime ({samples} cancels): "
            f"p50 {statistics.median(delays):.1f} ms  p90 {percentile(delays, 90):.1f} ms  max {max(delays):.1f} ms"
        )


_LATENCY = re.compile(r"p50 ([\d.]+) ms")
_DRAIN = re.compile(r"in-process runtime: ([\d,]+) Signals/s")


def _signals_round(src: Path, backend: str) -> tuple[float, float]:
    """One ``bench.signals`` run on the code in ``src``: emit → Run-start p50 (ms), drained/s."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    args = ["--backend", backend, "--latency-samples", "300", "--drain", "2000", "--command-drain", "0", "--persistent-drain", "0"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.signals", *args], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return float(_LATENCY.search(out)[1]), float(_DRAIN.search(out)[1].replace(",", ""))  # type: ignore[index]


def against(other: Path, backend: str, rounds: int) -> None:
    if not (other / "src" / "agent_gateway").is_dir():
        raise SystemExit(f"--against {other}: not a checkout of agent-gateway (no src/agent_gateway)")
    results: dict[str, list[tuple[float, float]]] = {"this": [], "other": []}
    for round_ in range(rounds):
        order = [("this", ROOT / "src"), ("other", other / "src")]
        for label, src in order if round_ % 2 == 0 else order[::-1]:
            results[label].append(_signals_round(src, backend))
    for label, values in results.items():
        print(
            f"{backend:<10} {label:<5}: emit → Run start p50 {statistics.median(v[0] for v in values):.2f} ms, "
            f"drained {statistics.median(v[1] for v in values):,.0f} Signals/s (median of {rounds} rounds)"
        )
    ratio = statistics.median(v[1] for v in results["this"]) / statistics.median(v[1] for v in results["other"])
    print(f"{backend:<10} drain rate, this / other: {ratio:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--against", type=Path, help="compare the worker's hot path with the checkout at this path")
    parser.add_argument("--rounds", type=int, default=6, help="with --against: rounds of each")
    args = parser.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        if args.against is not None:
            against(args.against, backend, args.rounds)
        else:
            latency_bench(backend, args.samples)


if __name__ == "__main__":
    main()
