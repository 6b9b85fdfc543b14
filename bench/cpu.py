"""Where a gateway's CPU goes: the processes that serve it, and their CPU time per unit of work.

:class:`Accounts` reads the kernel's count of each process's CPU time (``/proc/PID/stat``,
user and system) around a measured stretch: the ``serve`` process, its children (the agent
program), and on PostgreSQL the server processes of the gateway's database (named in their
command line) and the server's own background processes (the WAL writer, the checkpointer:
work the commits cause, shared by every database). A PostgreSQL connection is named after the
statement it ran last (``pg_stat_activity``): the writers that commit alone each keep a
connection of their own (``store.direct.Own``), so their connections name their statements.
Linux only; never part of the test run.
"""

from __future__ import annotations

import asyncio
import collections

import asyncpg

from bench import harness
from tests.served import ServedGateway

# How much of a connection's last statement names it.
LABEL_CHARS = 60


def _cpu_s(pid: int) -> float | None:
    """:func:`harness.cpu_s`; None once the process is gone."""
    try:
        return harness.cpu_s(pid)
    except (OSError, IndexError, ValueError):
        return None


class Accounts:
    """The CPU time of one gateway's processes, summed over the stretches between :meth:`start` and :meth:`stop`."""

    def __init__(self, served: ServedGateway) -> None:
        self.served = served
        url = served.database_url or ""
        self.database = url.rsplit("/", 1)[1] if url.startswith("postgresql") else None
        self.used: collections.Counter[str] = collections.Counter()  # label -> CPU seconds
        self._kinds: dict[int, str] = {}  # pid -> its kind (a label, or "connection")

    def _ours(self) -> dict[int, str]:
        """This gateway's processes now, each with its kind."""
        kinds = {}
        processes = harness.processes()
        serve = self.served.process.pid
        for pid, (parent, command) in processes.items():
            while parent not in (serve, 0, 1) and parent in processes:  # the sandbox's processes between
                parent = processes[parent][0]
            if pid == serve:
                kinds[pid] = "serve"
            elif parent == serve:
                kinds[pid] = "the agent program (and its sandbox)"
            elif self.database is not None and command.startswith("postgres:"):
                if f" {self.database} " in f"{command} ":
                    kinds[pid] = "PostgreSQL: autovacuum" if "autovacuum worker" in command else "connection"
                elif " postgres " not in command and " agw_" not in command:  # the server's own
                    kinds[pid] = "PostgreSQL: background (WAL writer, checkpointer, ...)"
        return kinds

    def start(self) -> dict[int, float]:
        """Before a stretch: the CPU time of the processes now serving."""
        self._kinds.update(self._ours())
        return {pid: cpu for pid in self._kinds if (cpu := _cpu_s(pid)) is not None}

    def stop(self, before: dict[int, float]) -> None:
        """After a stretch: add what each process used since :meth:`start`; a connection
        opened meanwhile counts from nothing."""
        self._kinds.update(self._ours())
        for pid, kind in self._kinds.items():
            now = _cpu_s(pid)
            if now is not None:
                self.used[f"{kind}:{pid}" if kind == "connection" else kind] += now - before.get(pid, 0.0)

    def table(self, units: int) -> list[tuple[str, float]]:
        """Milliseconds of CPU per unit (``units`` of them measured), by process, most first;
        a PostgreSQL connection named by its last statement."""
        names = asyncio.run(self._statements()) if self.database else {}
        per_unit: collections.Counter[str] = collections.Counter()
        for label, seconds in self.used.items():
            if label.startswith("connection:"):
                pid = int(label.split(":")[1])
                label = f"PostgreSQL: {names.get(pid, 'a connection since closed')}"
            per_unit[label] += seconds * 1000 / units
        return sorted(per_unit.items(), key=lambda item: -item[1])

    async def _statements(self) -> dict[int, str]:
        """Each open connection of the gateway's database: the start of its last statement."""
        admin = await asyncpg.connect(harness.POSTGRES_ADMIN)
        try:
            rows = await admin.fetch(
                "SELECT pid, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_activity WHERE datname = $1",
                self.database,
            )
        finally:
            await admin.close()
        return {pid: (query or "(no statement yet)")[:LABEL_CHARS] for pid, query in rows}
