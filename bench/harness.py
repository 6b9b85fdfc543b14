"""Benchmark harness: a real gateway process, ``wrk`` on loopback, and its numbers.

Used by every ``bench/*.py``; run ``python -m bench.run --help`` for the generic driver.
Needs Debian's ``wrk`` (``apt-get install wrk``). Never part of the test run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import orjson

from tests.served import SRC, ServedGateway

POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
WRK_THREADS = 1
WRK_CONNECTIONS = 16
WRK_DURATION_S = 10
# The setting for the number of HTTP processes (http.workers).
WORKERS = "AGENT_GATEWAY_HTTP_WORKERS"


@dataclasses.dataclass
class WrkResult:
    requests_per_s: float
    latency_ms: dict[str, float]  # "50", "75", "90", "99" -> milliseconds
    requests: int
    non_2xx: int
    errors: str

    def line(self, label: str) -> str:
        p = self.latency_ms
        extra = f"  non-2xx {self.non_2xx}" if self.non_2xx else ""
        extra += f"  socket errors: {self.errors}" if self.errors else ""
        return (
            f"{label:<44} {self.requests_per_s:>9,.0f} req/s   p50 {p.get('50', 0):6.2f} ms   "
            f"p90 {p.get('90', 0):6.2f} ms   p99 {p.get('99', 0):6.2f} ms{extra}"
        )


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: its parent's pid and its command line (arguments joined by spaces)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            found[int(entry.name)] = (parent, command)
    return found


def tree_cpu_s(pid: int) -> float:
    """:func:`cpu_s` of a process and of every live descendant (its HTTP workers, its agent)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in processes().items():
        children.setdefault(parent, []).append(child)
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += cpu_s(current)
        except OSError:
            continue
        pending.extend(children.get(current, []))
    return total


def interval(these: list[float], those: list[float], resamplings: int = 2000) -> tuple[float, float]:
    """Where the ratio of the sums of two series of alternating rounds falls in the middle 95 %
    of the rounds resampled with replacement (a bootstrap): how far the machine's swings leave
    the figure uncertain. Seeded, so the same rounds give the same interval."""
    rng = random.Random(0)
    rounds = range(len(these))
    ratios = sorted(
        sum(these[n] for n in picked) / sum(those[n] for n in picked)
        for picked in (rng.choices(rounds, k=len(these)) for _ in range(resamplings))
    )
    return ratios[int(resamplings * 0.025)], ratios[int(resamplings * 0.975) - 1]


def _to_ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def lua_request(method: str, body: object | None = None, headers: dict[str, str] | None = None) -> str:
    """A wrk script that sends one fixed request."""
    lines = [f'wrk.method = "{method}"']
    if body is not None:
        lines.append(f"wrk.body = {orjson.dumps(orjson.dumps(body).decode()).decode()}")
        lines.append('wrk.headers["Content-Type"] = "application/json"')
    for name, value in (headers or {}).items():
        lines.append(f'wrk.headers["{name}"] = "{value}"')
    return "\n".join(lines) + "\n"


def wrk(
    url: str,
    lua: str = "",
    *,
    duration_s: int = WRK_DURATION_S,
    connections: int = WRK_CONNECTIONS,
    threads: int = WRK_THREADS,
) -> WrkResult:
    """Run ``wrk -t1 -c16 -d10s --latency`` against ``url`` with a Lua script."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(lua)
        script.flush()
        command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", script.name, url]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    latency = {
        match.group(1): _to_ms(match.group(2), match.group(3))
        for match in re.finditer(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
    }
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return WrkResult(rps, latency, requests, int(non_2xx.group(1)) if non_2xx else 0, errors.group(1) if errors else "")


def wrk_cpu(pid: int, url: str, lua: str = "", *, duration_s: int = WRK_DURATION_S) -> tuple[WrkResult, float]:
    """:func:`wrk`, and the CPU the server process ``pid`` spent per request meanwhile, in
    microseconds: the machine's other load moves that far less than the requests per second."""
    before = cpu_s(pid)
    result = wrk(url, lua, duration_s=duration_s)
    return result, (cpu_s(pid) - before) / result.requests * 1e6


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(POSTGRES_ADMIN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def database(backend: str, directory: Path) -> Iterator[str]:
    """A fresh, empty database URL of ``backend`` (sqlite or postgresql), dropped afterwards."""
    os.sync()  # nor the kernel's write-back of an earlier run's files
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'bench.db'}"
        return
    if backend != "postgresql":
        raise SystemExit(f"unknown backend {backend!r}: sqlite or postgresql")
    name = f"agw_bench_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f"CREATE DATABASE {name}"))
    # An earlier run's bulk writes (a 1,000,000-Decision log) would otherwise still be
    # written out by PostgreSQL's checkpointer, spread over minutes, during this one.
    asyncio.run(_admin("CHECKPOINT"))
    try:
        yield POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@contextlib.contextmanager
def gateway(backend: str, env: dict[str, str] | None = None, src: Path = SRC) -> Iterator[ServedGateway]:
    """A real ``agent-gateway serve`` (made by ``init``) on free loopback ports; the code is this
    checkout's, or that of the checkout whose ``src`` is given."""
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        directory = Path(tmp)
        with database(backend, directory) as url:
            settings = {"AGENT_GATEWAY_LOG_LEVEL": "WARNING", **(env or {})}
            with ServedGateway.start(directory / "deployment", url, settings, src=src) as served:
                yield served


def time_command(argv: list[str], env: dict[str, str]) -> float:
    """Seconds the command ``argv`` takes to exit 0 (an interpreter's start included); a refusal ends the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:4])} refused: {done.stdout}{done.stderr}")
    return elapsed
