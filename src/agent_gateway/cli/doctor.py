"""``agent-gateway doctor``: whether ``serve`` would start here, checked without serving.

A command of its own rather than ``serve --check``: ``serve`` takes the SQLite
lock, creates the database file, migrates and binds, and a check must do none
of that (it runs beside a serving gateway too, where it reports the ports
taken); and its answer is a list of findings for a person, not a server.

Each finding is one line, ``ok`` or ``FAIL``, naming the check and what it
found; the exit status is 0 when every check passed, 1 otherwise (with one
error line). It checks what ``serve`` with every role needs: the signing key,
the database (reachable, and its schema one ``serve`` can use or migrate),
the three listening addresses, the agent program's confinement, and the files
the Run ledger publishes of it (none a link where the agent writes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import sqlalchemy as sa
import typer

from agent_gateway import config, errors
from agent_gateway.cli.common import ConfigOption, database_problem, fail, load_settings, masked
from agent_gateway.ledger import instructions
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store

# Reaching the database gives up after this long: a host that drops packets must not hang the check.
DATABASE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL':<4}  {self.check}: {self.detail}"


def doctor(config_path: ConfigOption = None) -> None:
    """Check, without serving, what serve needs here: the signing key, the database (reachable,
    its schema), the listening addresses (free), the agent program's confinement and the files
    the Run ledger publishes; one line each, exit status 1 when one fails."""
    settings = load_settings(config_path)
    findings = [
        signing_key(settings),
        database(settings),
        *(listening(address, field) for address, field in addresses(settings)),
        confinement(settings),
        instructions_files(settings),
    ]
    for finding in findings:
        typer.echo(finding.line())
    failed = [finding.check for finding in findings if not finding.ok]
    if failed:
        raise fail(f"{len(failed)} of {len(findings)} checks failed ({', '.join(failed)}): serve would not start")


def signing_key(settings: config.Settings) -> Finding:
    try:
        identity = SigningIdentity.from_settings(settings)
    except errors.GatewayError as exc:
        return Finding("signing key", False, exc.message)
    where = "signing.key" if settings.signing_key_pem is not None else str(settings.signing_key_file)
    return Finding("signing key", True, f"{where}: {identity.kind} key, {identity.algorithm}")


def database(settings: config.Settings) -> Finding:
    url = settings.database_url
    name = f"database {masked(url)}"
    file = sa.make_url(url).database
    if url.startswith("sqlite") and file and file != ":memory:" and not Path(file).exists():
        folder = Path(file).parent
        if not os.access(folder, os.W_OK):
            return Finding(name, False, f"no database file, and serve cannot create one in {folder}")
        return Finding(name, True, f"no database file yet: serve creates it and its schema (revision {migrate.HEAD})")
    try:
        found = asyncio.run(_schema(url))
        found.require_migratable(force=False)
    except Exception as exc:
        problem = database_problem(exc)
        if problem is None:
            raise
        return Finding(name, False, problem)
    if found.is_current:
        return Finding(name, True, f"reachable, schema at revision {migrate.HEAD} (current)")
    if found.is_empty:
        return Finding(name, True, f"reachable, no schema yet: serve creates it (revision {migrate.HEAD})")
    return Finding(name, True, f"reachable, schema at revision {found.revision}: serve upgrades it to {migrate.HEAD}")


async def _schema(url: str) -> migrate.Schema:
    store = Store(url)
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT_S):
            return await migrate.schema(store.engine)
    finally:
        await store.close()


def addresses(settings: config.Settings) -> list[tuple[config.Address, str]]:
    """Each address serve listens on, with the field of the setting that moves it."""
    listed = [(settings.public_listen, "public_listen"), (settings.agent_listen, "agent_listen")]
    if settings.ops_listen is not None:
        listed.append((settings.ops_listen, "ops_listen"))
    return listed


def listening(address: config.Address, field: str) -> Finding:
    """Whether serve could listen on ``address``: bound as serve binds it, then let go at once."""
    from agent_gateway import serving  # serve's own bind, so the check and its wording are serve's

    name = config.named(field).split(" ")[0]
    try:
        serving.listen(address, field).close()
    except errors.GatewayError as exc:
        return Finding(name, False, exc.message)
    return Finding(name, True, f"{address} is free")


def instructions_files(settings: config.Settings) -> Finding:
    """What the Run ledger publishes of the agent's files can be read (ledger.instructions)."""
    try:
        count = instructions.check(settings)
    except instructions.InstructionsError as exc:
        return Finding("instructions", False, str(exc))
    return Finding("instructions", True, f"{count} file(s) runtime.command names, readable for the Run ledger")


def confinement(settings: config.Settings) -> Finding:
    # Imported here: every other command starts without the sandbox's modules.
    from agent_gateway.sandbox import choose
    from agent_gateway.sandbox.bubblewrap import SandboxError

    try:
        return Finding("confinement", True, choose.confinement(settings))
    except SandboxError as exc:
        return Finding("confinement", False, str(exc))
