"""PostgreSQL's statements per Message → its Run done, counted by the database itself (issue 40).

    python -m bench.roundtrips [--messages 40] [--log /var/log/postgresql/postgresql-15-main.log]
                               [--against /tmp/before]

A fresh real gateway (``bench.harness``, the echo agent kept warm under the persistent runtime)
on a database made for it with ``log_statement = 'all'`` (set on that database only, before the
gateway connects), then a User's Messages one after another (``bench.agent.sequential``), each
waited for until its answer is readable. Every statement the server logs for the database while
they run is one round trip of the gateway's or of the bench's polling (asyncpg's extended
protocol: a statement's parse, bind and execute go in one), counted per Message: those inside a
transaction (``BEGIN`` … ``COMMIT``: the writes of the path, the bench's reads never are) and
the single reads outside one (the caller's Token, and the bench's polls of the log). Each
statement is listed with its count per Message, by its text's start.

It reads the server's log (``--log``: Debian's path by default), which needs the rights to read
it and ``log_line_prefix`` naming the process (``[%p]``) and the database (``@%d``), as Debian's
default does. ``--against`` counts another checkout's (``git archive <commit> src | tar -x -C
/tmp/before``) after this one's. No timing is taken: the counts do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import time
from pathlib import Path

from bench import harness
from bench.agent import sequential
from bench.messages import admit_with_token
from tests.served import SRC

DEBIAN_LOG = Path("/var/log/postgresql/postgresql-15-main.log")
# How long the server may take to write the log lines of what has just been answered.
SETTLE_S = 1.0
_LINE = re.compile(r"\[(\d+)\] \S*@(\w+) LOG:  (?:statement|execute [^:]*): (.*)")


def count(src: Path, messages: int, log: Path) -> None:
    admin = harness._admin
    databases: list[str] = []

    async def logged(sql: str) -> None:
        await admin(sql)
        if made := re.fullmatch(r"CREATE DATABASE (\w+)", sql):
            databases.append(made.group(1))
            await admin(f"ALTER DATABASE {made.group(1)} SET log_statement = 'all'")

    harness._admin = logged
    try:
        with harness.gateway("postgresql", {"AGENT_GATEWAY_RUNTIME_MODE": "persistent"}, src=src) as served:
            _, auth = admit_with_token(served)
            asyncio.run(sequential(served, 3, auth))  # warm: the agent started, statements prepared
            time.sleep(SETTLE_S)
            with log.open("rb") as before:
                start = before.seek(0, 2)
            asyncio.run(sequential(served, messages, auth))
            time.sleep(SETTLE_S)
            with log.open("rb") as after:
                after.seek(start)
                lines = after.read().decode(errors="replace").splitlines()
    finally:
        harness._admin = admin
    in_transaction: set[str] = set()
    counts: collections.Counter[tuple[bool, str]] = collections.Counter()
    for line in lines:
        matched = _LINE.search(line)
        if matched is None or matched.group(2) != databases[0]:
            continue
        pid, text = matched.group(1), " ".join(matched.group(3).split())
        if text.startswith("BEGIN"):
            in_transaction.add(pid)
        counts[pid in in_transaction, text[:90]] += 1
        if text.startswith(("COMMIT", "ROLLBACK")):
            in_transaction.discard(pid)
    written = sum(n for (inside, _), n in counts.items() if inside)
    read = sum(n for (inside, _), n in counts.items() if not inside)
    print(f"{src}: {messages} Messages: {written / messages:.2f} statements per Message in transactions, "
          f"{read / messages:.2f} single reads")
    for (inside, text), n in sorted(counts.items(), key=lambda item: (not item[0][0], -item[1])):
        print(f"  {'txn' if inside else 'read'} {n / messages:6.2f}  {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--log", type=Path, default=DEBIAN_LOG)
    parser.add_argument("--against", type=Path, help="another checkout (or its src's parent) to count after this one")
    args = parser.parse_args()
    count(SRC, args.messages, args.log)
    if args.against is not None:
        count(args.against.resolve() / "src", args.messages, args.log)


if __name__ == "__main__":
    main()
