"""Signal Worker benchmarks: emit-commit → Run-start latency, and Signals drained per second.

    python -m bench.signals [--backend sqlite|postgresql|both] [--latency-samples N] [--drain N] [--command-drain N]
                            [--persistent-drain N]

All in one process on a fresh database (``harness.database``): the worker of a
started ``Gateway`` with a Handler that makes one Prompt per Signal, on uvloop's event
loop as in ``serve``.

- latency: emit one Signal, wait for its Run to reach the runtime, repeat. The
  time from the emitting transaction's commit to the runtime being called
  (which is after the Run's ``running`` write has committed); target p99 ≤ 10 ms.
- drained/s: Signals queued before start, then drained by an in-process runtime
  that returns at once (target ≥ 300/s) — each Signal is a claim, one Run
  recorded, started and ended, and the Signal finished. Timed from the first
  Run's start to the last one's end, as the Runs record them.
- drained/s with the command runtime running ``/bin/true`` (one process per Run).
- drained/s with the persistent runtime and an agent that answers each Run at
  once (``INSTANT_AGENT``): the worker's own cost plus one JSON-lines round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
import uvloop

from agent_gateway import clock, config
from agent_gateway.gateway import Gateway
from agent_gateway.signals import service
from agent_gateway.signatures import keys
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.tables import runs, signals
from bench import harness

KIND = "bench"
# A persistent agent that answers every Run done at once.
INSTANT_AGENT = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    sys.stdout.write(json.dumps({'type': 'done', 'run': json.loads(line)['run']['id']}) + '\\n')\n"
    "    sys.stdout.flush()\n"
)
EMIT_BATCH = 200
SIGNING_KEY = keys.generate_pem("ed25519").decode()


class Instant:
    """An in-process runtime that returns at once, noting when each Run reached it."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.at = 0.0

    async def run(self, run: Run) -> None:
        self.at = time.perf_counter()
        self.reached.set()


def _settings(
    url: str, workdir: Path, command: tuple[str, ...] | None = None, mode: str = "per-run"
) -> config.Settings:
    return config.Settings(
        token_ttl_ms=3_600_000,
        database_url=url,
        signing_key_pem=SIGNING_KEY,
        runtime_command=command,
        runtime_mode=mode,
        runtime_workdir=workdir,
        handlers={KIND: {"template": "Signal {{ n }}", "session": "bench"}},
    )


async def latency(url: str, workdir: Path, samples: int) -> list[float]:
    runtime = Instant()
    gateway = Gateway(_settings(url, workdir))
    gateway.runtime = runtime
    await gateway.start()
    try:
        # On PostgreSQL the worker first takes leadership: measure from then on.
        while gateway.worker is None or not gateway.worker.active:
            await asyncio.sleep(0.01)
        delays = []
        for n in range(samples):
            runtime.reached.clear()
            async with gateway.store.transaction() as conn:
                await service.emit(conn, KIND, {"n": n})
            committed = time.perf_counter()
            await runtime.reached.wait()
            delays.append((runtime.at - committed) * 1000)
        return delays
    finally:
        await gateway.stop()


async def drain(url: str, workdir: Path, count: int, command: tuple[str, ...] | None, mode: str = "per-run") -> float:
    """Queue ``count`` Signals, start a gateway, and time until none is pending or processing."""
    store = Store(url)
    try:
        for start in range(0, count, EMIT_BATCH):
            async with store.transaction() as conn:
                for n in range(start, min(start + EMIT_BATCH, count)):
                    await service.emit(conn, KIND, {"n": n})
    finally:
        await store.close()
    gateway = Gateway(_settings(url, workdir, command, mode))
    if command is None:
        gateway.runtime = Instant()
    await gateway.start(migrate_first=False)
    unfinished = sa.select(sa.func.count()).where(signals.c.state.in_(("pending", "processing")))
    # Timed by the Runs' own instants, from the first start to the last end: on PostgreSQL a
    # new leader waits leadership.TAKEOVER_WAIT * leadership.CHECK_S before working, which is not the drain.
    span = sa.select(sa.func.min(runs.c.started_at), sa.func.max(runs.c.ended_at))
    try:
        while True:
            async with gateway.store.read() as conn:
                if not (await conn.execute(unfinished)).scalar_one():
                    break
            await asyncio.sleep(0.1)
        async with gateway.store.read() as conn:
            done = (await conn.execute(sa.select(sa.func.count()).where(signals.c.state == "done"))).scalar_one()
            first, last = (await conn.execute(span)).one()
        if done != count:
            raise SystemExit(f"only {done} of {count} Signals ended done")
        return count / (clock.parse_instant(last) - clock.parse_instant(first)).total_seconds()
    finally:
        await gateway.stop()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench(backend: str, samples: int, drained: int, command_drained: int, persistent_drained: int) -> None:
    true = shutil.which("true") or "/bin/true"
    with tempfile.TemporaryDirectory(prefix="agw-bench-signals-") as tmp:
        directory = Path(tmp)
        with harness.database(backend, directory) as url:
            asyncio.run(migrate.upgrade_url(url))
            delays = uvloop.run(latency(url, directory / "ws", samples))
        print(
            f"{backend:<10} emit-commit → Run start ({samples} Signals, one at a time): "
            f"p50 {statistics.median(delays):.2f} ms  p90 {percentile(delays, 90):.2f} ms  "
            f"p99 {percentile(delays, 99):.2f} ms  max {max(delays):.2f} ms"
        )
    for label, count, command, mode in (
        ("in-process runtime", drained, None, "per-run"),
        (f"command runtime ({true})", command_drained, (true,), "per-run"),
        ("persistent runtime (an agent answering at once)", persistent_drained, (sys.executable, "-c", INSTANT_AGENT), "persistent"),
    ):
        if not count:
            continue
        with tempfile.TemporaryDirectory(prefix="agw-bench-signals-") as tmp:
            directory = Path(tmp)
            with harness.database(backend, directory) as url:
                asyncio.run(migrate.upgrade_url(url))
                rate = uvloop.run(drain(url, directory / "ws", count, command, mode))
        print(f"{backend:<10} drained, {label}: {rate:,.0f} Signals/s ({count} Signals)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--drain", type=int, default=3000)
    parser.add_argument("--command-drain", type=int, default=500)
    parser.add_argument("--persistent-drain", type=int, default=3000)
    args = parser.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        bench(backend, args.latency_samples, args.drain, args.command_drain, args.persistent_drain)


if __name__ == "__main__":
    main()
