"""Fixtures for the operator's reads: a config file on each backend, and a database with a bit of everything."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from agent_gateway import config
from agent_gateway.cli.main import app
from agent_gateway.decisions import service as decisions
from agent_gateway.messages import service as messages
from agent_gateway.signals import service as signals
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.users import service as users


@pytest.fixture
def config_file(tmp_path: Path, database_url: str, signing_key_file: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[database]\nurl = "{database_url}"\n\n[signing]\nkey_file = "{signing_key_file}"\n\n'
        "[auth]\ntoken_ttl_ms = 60000\n"
    )
    return path


def run(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(app, [*args, "--config", str(config_file)])


def run_json(config_file: Path, *args: str) -> Any:
    result = run(config_file, *args)
    assert result.exit_code == 0, result.stderr
    return orjson.loads(result.stdout)


@dataclasses.dataclass
class Recorded:
    """What :func:`recorded` wrote: a User with three Messages (two inbound, so two Signals), a
    Signal of another kind, two Decisions; the first Signal is done with a done Run, the second
    failed with a failed Run, the third pending."""

    user_id: str
    signal_ids: list[str]  # oldest first: done, failed (both message.received), pending (tick)
    run_ids: list[str]  # the done Run, then the failed one


@pytest.fixture
def recorded(settings: config.Settings) -> Recorded:
    return asyncio.run(_record(settings))


async def _record(settings: config.Settings) -> Recorded:
    store = Store(settings.database_url)
    identity = SigningIdentity.from_settings(settings)
    try:
        async with store.transaction() as conn:
            user = await users.admit(conn)
        for text in ("first question", "second question"):
            async with store.transaction() as conn:
                await messages.receive(conn, user.id, text)
        async with store.transaction() as conn:
            await messages.send(conn, user.id, "an answer")
            await signals.emit(conn, "tick", {"n": 1})
            await decisions.publish_many(conn, identity, ["one", "two"])
        run_ids = []
        for outcome in (None, "it broke"):
            async with store.transaction() as conn:
                signal = await signal_queries.claim_oldest(conn)
                assert signal is not None
                [run] = await run_queries.record(conn, signal_id=signal.id, prompts=[(str(uuid.uuid4()), None, "p")])
                await run_queries.start(conn, id=run.id, started_at="2026-01-01T00:00:00.000Z")
                await run_queries.finish(conn, id=run.id, error=outcome, ended_at="2026-01-01T00:00:01.000Z")
                await signal_queries.finish(conn, id=signal.id, error=outcome)
                run_ids.append(run.id)
        async with store.read() as conn:
            signal_ids = [signal.id for signal in reversed(await signals.list_signals(conn, 10))]
        return Recorded(user.id, signal_ids, run_ids)
    finally:
        await store.close()
