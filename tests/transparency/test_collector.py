"""The witness collector against real witnesses (aics-witness from PyPI, tests/servers.py): woken
by a publish in another process, quorum, a witness down and back, a witness with another key for the log, a restart,
a 409 resync (also to the size the witness holds: it cosigns that size again), and two processes on PostgreSQL with
one collector; the Run ledger witnessed by the same witnesses (woken by each entry, refused by a witness not told its
origin, and audited with them). Witnesses whose answers go wrong: tests/transparency/test_collector_answers.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import logging
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.ops import metrics
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.tables import witness_cosignatures
from agent_gateway.transparency import collector, note, proof, service, witness
from tests import servers
from tests.cli.test_main import one_error_line
from tests.ledger.test_audit import emit
from tests.ledger.test_routes import runs
from tests.served import ServedGateway, run_cli_here
from tests.transparency.test_routes import publish

pytestmark = pytest.mark.processes

# Ceilings, never durations: a witness that was down is retried within the 60 s backoff cap.
CEILING_S = 180.0


@pytest.fixture(scope="module")
def witnesses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[servers.Witness]]:
    """Three witnesses, shared by the module's tests: each test has a log (an origin) of its own."""
    with contextlib.ExitStack() as stack:
        try:
            started = [stack.enter_context(servers.witness(tmp_path_factory.mktemp(f"w{n}"), f"w{n}.test/w")) for n in (1, 2, 3)]
        except servers.CannotInstall as exc:
            if os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_WITNESS"):
                pytest.fail(f"the witness is required: {exc}")
            pytest.skip(str(exc))
        yield started


@pytest.fixture
def unswept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectors that look again only when woken: unwoken, only after an hour, far past the ceiling of the waits."""
    monkeypatch.setattr(collector, "SWEEP_S", 3600.0)


@pytest.fixture
def origin() -> str:
    return f"agent-gateway.test/{uuid.uuid4().hex[:12]}"


def with_witnesses(settings: config.Settings, origin: str, listed: list[servers.Witness], quorum: int | None = None) -> config.Settings:
    return dataclasses.replace(
        settings, transparency_origin=origin, witnesses=tuple(config.Witness(w.url, w.vkey) for w in listed),
        witness_quorum=quorum,
    )


def trusted_by(settings: config.Settings, origin: str, listed: list[servers.Witness]) -> config.Settings:
    """``settings`` listing the witnesses ``listed``, each configured with the origin and key of
    both logs (the Decision log's, the Run ledger's), as docs/users/witnesses.md tells operators."""
    settings = with_witnesses(settings, origin, listed)
    ledger = service.ledger_signer(settings, SigningIdentity.from_settings(settings))
    for each in listed:
        each.trust(origin, log_vkey(settings))
        each.trust(ledger.origin, ledger.key.vkey())
    return settings


def log_vkey(settings: config.Settings, identity: SigningIdentity | None = None) -> str:
    """The gateway's checkpoint vkey, which a witness is configured with for the Decision log."""
    return service.signer(settings, identity or SigningIdentity.from_settings(settings)).key.vkey()


@pytest.fixture
async def running() -> AsyncIterator[Callable[[config.Settings], "asyncio.Future[Gateway]"]]:
    """Starts gateways; each is stopped at the end of the test (if the test did not)."""
    started: list[Gateway] = []

    async def start(settings: config.Settings, roles: frozenset[str] | None = None) -> Gateway:
        gateway = Gateway(settings) if roles is None else Gateway(settings, roles)
        await gateway.start()
        started.append(gateway)
        return gateway

    yield start  # type: ignore[misc]
    for gateway in started:
        if not getattr(gateway, "_stopped_by_test", False):
            await gateway.stop()


async def stop(gateway: Gateway) -> None:
    gateway._stopped_by_test = True  # type: ignore[attr-defined]
    await gateway.stop()


async def wait_for(check: Callable[[], "asyncio.Future[bool]"], what: str) -> None:
    async with asyncio.timeout(CEILING_S):
        while not await check():
            await asyncio.sleep(0.05)


def client(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_asgi), base_url="http://agent")


async def witnessed_at(gateway: Gateway, size: int, what: str) -> None:
    """Wait (a ceiling of minutes) until ``gateway`` serves a witnessed checkpoint of ``size``."""

    async def there() -> bool:
        return await witnessed_size(gateway) == size

    await wait_for(there, what)


async def witnessed_size(gateway: Gateway, prefix: str = "") -> int | None:
    """The size of the witnessed checkpoint of the log under ``prefix`` (the Decision log's, "/ledger")."""
    async with client(gateway) as agent:
        response = await agent.get(f"{prefix}/checkpoint/witnessed")
    if response.status_code == 404:
        return None
    assert response.status_code == 200
    return note.Checkpoint.parse(response.content[: response.content.index(b"\n\n") + 1]).size


async def cosigned_by(gateway: Gateway, listed: servers.Witness) -> list[int]:
    async with gateway.store.read() as conn:
        rows = await conn.execute(
            sa.select(witness_cosignatures.c.tree_size).where(witness_cosignatures.c.witness == listed.vkey)
        )
        return sorted(size for (size,) in rows)


async def test_a_quorum_of_real_witnesses_cosigns_and_the_note_verifies(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    gateway = await running(settings)
    async with client(gateway) as agent:
        await publish(agent, 3)
        await witnessed_at(gateway, 3, "witnessed at 3")
        response = await agent.get("/checkpoint/witnessed")
        text = response.content[: response.content.index(b"\n\n") + 1]
        lines = response.content.split(b"\n\n", 1)[1].split(b"\n")[1:-1]
        for listed, line in zip(witnesses[:2], lines):
            assert witness.cosignature_of(witness.WitnessKey.parse(listed.vkey), text, line + b"\n") is not None
        # More Decisions: the witnessed checkpoint follows.
        await publish(agent, 4)
        await witnessed_at(gateway, 7, "witnessed at 7")
    # The metric per witness: the largest size it cosigned.
    for listed in witnesses[:2]:
        name = witness.WitnessKey.parse(listed.vkey).name
        assert metrics.witness_cosigned_size.labels("decisions", name)._value.get() == 7  # type: ignore[attr-defined]


async def test_a_publish_in_another_process_wakes_the_collector_and_many_are_coalesced(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable, unswept: None
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    leader = await running(settings)
    async with client(leader) as agent:
        await publish(agent, 1)
    await witnessed_at(leader, 1, "witnessed at 1")  # the collector now waits for the next publish
    # Another process that serves the API only (on SQLite, as serve's HTTP workers are).
    api = await running(settings, frozenset({"api"}))
    async with client(api) as agent:
        await publish(agent, 1)
        await witnessed_at(leader, 2, "woken by the other process's publish")
        await asyncio.gather(*(publish(agent, 1) for _ in range(40)))
    await witnessed_at(leader, 42, "witnessed at 42")
    # Coalesced: far fewer cosigned tree sizes than Decisions.
    for listed in witnesses[:2]:
        assert len(await cosigned_by(leader, listed)) < 42


async def test_a_witness_down_delays_only_itself_and_catches_up_on_its_return(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable
) -> None:
    settings = with_witnesses(settings, origin, witnesses, quorum=2)
    for listed in witnesses:
        listed.trust(origin, log_vkey(settings))
    down = witnesses[2]
    down.stop()
    try:
        gateway = await running(settings)
        async with client(gateway) as agent:
            await publish(agent, 2)  # publishes answer while a witness is down

            await witnessed_at(gateway, 2, "witnessed by the two up")
            assert await cosigned_by(gateway, down) == []
    finally:
        down.start()

    async def caught_up() -> bool:
        return 2 in await cosigned_by(gateway, down)

    await wait_for(caught_up, "the returning witness cosigns")


async def test_a_witness_with_another_key_for_the_log_never_cosigns_and_says_so_once(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = with_witnesses(settings, origin, witnesses[:2], quorum=1)
    witnesses[0].trust(origin, log_vkey(settings))
    witnesses[1].trust(origin, log_vkey(settings, SigningIdentity(keys.generate_pem("ed25519"))))
    caplog.set_level(logging.INFO, "agent_gateway.transparency.collector")
    gateway = await running(settings)
    async with client(gateway) as agent:
        await publish(agent, 1)

        await witnessed_at(gateway, 1, "witnessed by the other")
        await publish(agent, 1)

        await witnessed_at(gateway, 2, "witnessed again by the other")
    assert await _failures(gateway, witnesses[1]) >= 1
    assert await cosigned_by(gateway, witnesses[1]) == []
    refusals = [
        r.getMessage() for r in caplog.records
        if r.__dict__.get("action") == "witness_refused" and r.__dict__.get("log") == "decisions"
    ]
    assert len(refusals) == 1 and "403" in refusals[0] and "transparency.witnesses[1]" in refusals[0]
    # Neither witness was told the Run ledger's origin: each refuses it (404), one line each naming the ledger.
    def ledger_refusals() -> list[str]:
        return [
            r.getMessage() for r in caplog.records
            if r.__dict__.get("action") == "witness_refused" and r.__dict__.get("log") == "ledger"
        ]

    async def both_refused() -> bool:
        return len(ledger_refusals()) >= 2

    await wait_for(both_refused, "the ledger refused by both")
    assert len(ledger_refusals()) == 2 and all("404" in line and "the ledger log" in line for line in ledger_refusals())
    assert await witnessed_size(gateway, "/ledger") is None
    assert all(r.exc_info is None for r in caplog.records)


async def test_a_fork_of_a_witnessed_log_is_refused_by_the_witness_with_422_and_said_so_once(
    settings: config.Settings, another_database_url: str, witnesses: list[servers.Witness], origin: str,
    running: Callable, caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator's second log under the same key and origin, larger than the one witnessed: the
    collector resyncs from the witness's size (409) and sends the fork's consistency proof from
    it, which the witness finds does not verify (422, c2sp.org/tlog-witness): refused, one line
    that says what that means, not a setting to check, and never a cosignature of the fork."""
    settings = with_witnesses(settings, origin, witnesses[:1])
    witnesses[0].trust(origin, log_vkey(settings))
    caplog.set_level(logging.INFO, "agent_gateway.transparency.collector")
    honest = await running(settings)
    async with client(honest) as agent:
        await publish(agent, 3)
    await witnessed_at(honest, 3, "the honest log witnessed")
    await stop(honest)

    fork = await running(dataclasses.replace(settings, database_url=another_database_url))
    async with client(fork) as agent:
        await publish(agent, 5)

    def refusals() -> list[str]:
        return [
            r.getMessage() for r in caplog.records
            if r.__dict__.get("action") == "witness_refused" and r.__dict__.get("log") == "decisions"
        ]

    async def refused() -> bool:
        return bool(refusals())

    await wait_for(refused, "the fork refused")
    [line] = refusals()
    assert "422: the consistency proof from the tree size it holds does not verify" in line
    assert "compare the log with what the witness holds" in line and "transparency.witnesses" not in line
    assert await cosigned_by(fork, witnesses[0]) == [] and await witnessed_size(fork) is None
    assert all(r.exc_info is None for r in caplog.records)


async def _failures(gateway: Gateway, listed: servers.Witness) -> float:
    name = witness.WitnessKey.parse(listed.vkey).name
    return metrics.witness_failures.labels("decisions", name)._value.get()  # type: ignore[attr-defined]


async def test_a_witness_that_holds_the_current_size_cosigns_it_again_and_the_collector_then_waits(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = trusted_by(settings, origin, witnesses[:1])
    first = await running(settings)
    async with client(first) as agent:
        await publish(agent, 3)
    await witnessed_at(first, 3, "witnessed at 3")
    # The gateway forgets the cosignature (a restored backup, say): the witness answers 409 with
    # the size the log has now, and the collector resubmits from it (old size 3, no proof): the
    # witness cosigns the same root again, with no publish to wake the collector.
    async with first.store.transaction() as conn:
        await conn.execute(sa.delete(witness_cosignatures))
    await stop(first)
    caplog.set_level(logging.INFO, "agent_gateway.transparency.collector")
    again = Gateway(settings)
    reads, latest = 0, again.checkpoints.latest

    async def counted() -> bytes:
        nonlocal reads
        reads += 1
        return await latest()

    again.checkpoints.latest = counted  # type: ignore[method-assign]
    await again.start()
    try:
        await witnessed_at(again, 3, "witnessed at 3 again, without a publish")
        assert await cosigned_by(again, witnesses[0]) == [3]
        assert any(
            r.__dict__.get("action") == "witness_resync" and "holds tree size 3" in r.getMessage() for r in caplog.records
        )
        before = reads
        # Proving that something does not happen: a collector that went round again at once read
        # the checkpoint without end, and on SQLite (whose reads here never wait) never gave the
        # event loop back: the gateway froze (without the fix this test ends at pytest's timeout).
        # A waiting collector reads it again on a publish or an answer, or at its sweep.
        await asyncio.sleep(1.0)
        assert reads - before <= 2, reads - before
        async with client(again) as agent:
            await publish(agent, 2)
        await witnessed_at(again, 5, "witnessed at 5")
    finally:
        await again.stop()


async def test_after_a_restart_the_witnessed_checkpoint_is_served_at_once_and_a_409_resyncs(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    first = await running(settings)
    async with client(first) as agent:
        await publish(agent, 3)

    await witnessed_at(first, 3, "witnessed at 3")
    await stop(first)
    # Served at once by a process that collects nothing (no worker role): from the table.
    api = await running(settings, frozenset({"api"}))
    assert await witnessed_size(api) == 3
    # The gateway forgets what the first witness cosigned: it resubmits from 0, the witness answers
    # 409 with its size 3, and the collector resubmits from there.
    async with api.store.transaction() as conn:
        await conn.execute(sa.delete(witness_cosignatures).where(witness_cosignatures.c.witness == witnesses[0].vkey))
    await stop(api)
    caplog.set_level(logging.INFO, "agent_gateway.transparency.collector")
    again = await running(settings)
    async with client(again) as agent:
        await publish(agent, 2)

    await witnessed_at(again, 5, "witnessed at 5 after the resync")
    assert any(r.__dict__.get("action") == "witness_resync" and "holds tree size 3" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # several processes share PostgreSQL only
async def test_two_processes_on_postgresql_run_one_collector(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    one, two = await running(settings), await running(settings)
    async with client(one) as agent:
        await publish(agent, 2)

    await witnessed_at(two, 2, "witnessed at 2")
    assert [one.collectors["witness collector"].active, two.collectors["witness collector"].active].count(True) == 1
    leader, standby = (one, two) if one.collectors["witness collector"].active else (two, one)
    await stop(leader)
    async with client(standby) as agent:
        await publish(agent, 1)

    await witnessed_at(standby, 3, "the standby took over")
    assert standby.collectors["witness collector"].active
    for listed in witnesses[:2]:
        assert await cosigned_by(standby, listed) == [2, 3]


@pytest.fixture
def another_database_url(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Iterator[str]:
    """A second fresh, migrated database of the backend of ``database_url``."""
    if database_url.startswith("sqlite"):
        path = tmp_path / "another.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    with request.getfixturevalue("postgres_databases").url(migrated=True) as url:
        yield url


@pytest.mark.parametrize("log", ["decisions", "ledger"])
def test_audit_with_witnesses_refuses_a_fork_of_the_log_it_remembers_witnessed(
    log: str, database_url: str, another_database_url: str, witnesses: list[servers.Witness], origin: str,
    tmp_path: Path,
) -> None:
    # The operator's honest log (the Decision log, or the Run ledger with --ledger), witnessed; the
    # party audits it and remembers its checkpoint.
    pem = keys.generate_pem("ed25519")
    keys.write_private(tmp_path / "signing-key.pem", pem)
    identity = SigningIdentity(pem)
    prefix, log_origin = ("", origin) if log == "decisions" else ("/ledger", origin + "/ledger")
    vkey = note.NoteSigner(log_origin, identity.key, identity.algorithm).key.vkey()
    for listed in witnesses[:2]:
        listed.trust(log_origin, vkey)
    # The same key and origin for both: the fork is the operator's own second log.
    env = {
        "AGENT_GATEWAY_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
        "AGENT_GATEWAY_TRANSPARENCY_ORIGIN": origin,
        "AGENT_GATEWAY_TRANSPARENCY_WITNESSES": json.dumps([{"url": w.url, "vkey": w.vkey} for w in witnesses[:2]]),
    }
    state, jwks = tmp_path / "audit-state.json", tmp_path / "jwks.json"
    jwks.write_text(json.dumps(identity.jwks()))
    witnessed_by = [arg for listed in witnesses[:2] for arg in ("--witness", listed.vkey)]
    which = [] if log == "decisions" else ["--ledger"]

    def audit(gateway: ServedGateway) -> subprocess.CompletedProcess[str]:
        return run_cli_here("audit", gateway.agent_url, *which, "--jwks", str(jwks), "--state", str(state),
                            *witnessed_by, config=tmp_path / "none.toml")

    with ServedGateway.start(tmp_path / "honest", database_url, env) as honest:
        served_grow(honest, prefix, 3)
        wait_until(lambda: served_witnessed_size(honest, prefix) == 3)
        assert audit(honest).returncode == 0
    # The fork: other entries under the same key and origin, of the same size and then larger.
    with ServedGateway.start(tmp_path / "fork", another_database_url, env) as fork:
        for size in (3, 5):
            served_grow(fork, prefix, size)
            line = one_error_line(audit(fork))
            assert f"checkpoint {size} is not consistent with remembered checkpoint 3" in line
            assert "forks from the one remembered (a split view" in line
    # Nothing of a refused round is remembered.
    assert json.loads(state.read_text())["size"] == 3


def served_grow(gateway: ServedGateway, prefix: str, size: int) -> None:
    """Grow the served log under ``prefix`` (the Decision log's, the ledger's) to ``size``
    entries: Decisions published, or Signals emitted as the operator's code would (a Run each)."""
    while (current := served_size(gateway, prefix)) < size:
        if prefix:
            asyncio.run(emit(gateway.env["AGENT_GATEWAY_DATABASE_URL"], "message.received", {"userId": "u", "text": "hi"}))
            wait_until(lambda: served_size(gateway, prefix) > current)
        else:
            served_publish(gateway, size - current)


def served_size(gateway: ServedGateway, prefix: str) -> int:
    return int(httpx.get(f"{gateway.agent_url}{prefix}/checkpoint", timeout=60).text.split("\n")[1])


def served_publish(gateway: ServedGateway, count: int) -> None:
    for index in range(count):
        response = httpx.post(f"{gateway.agent_url}/decisions", json={"statement": f"{gateway.directory.name} {index}"}, timeout=60)
        assert response.status_code == 201, response.text


def served_witnessed_size(gateway: ServedGateway, prefix: str = "") -> int:
    response = httpx.get(f"{gateway.agent_url}{prefix}/checkpoint/witnessed", timeout=60)
    if response.status_code == 404:
        return 0
    return note.Checkpoint.parse(response.content[: response.content.index(b"\n\n") + 1]).size


def wait_until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + CEILING_S
    while not check():
        assert time.monotonic() < deadline, "not within the ceiling"
        time.sleep(0.05)


def aics_tlog(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(servers.WITNESS.python), "-m", "aics_tlog", *argv], capture_output=True, text=True, timeout=servers.START_TIMEOUT_S
    )


async def test_a_real_witnessed_proof_verifies_here_and_with_aics_tlog(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable, tmp_path: Path
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    gateway = await running(settings)
    async with client(gateway) as agent:
        published = await publish(agent, 5)

        await witnessed_at(gateway, 5, "witnessed at 5")
        response = await agent.get(f"/decisions/{published[2]['seq']}/proof?format=tlog-proof")
    assert response.status_code == 200
    parsed = proof.TlogProof.parse(response.content)
    witness_keys = [witness.WitnessKey.parse(listed.vkey) for listed in witnesses[:2]]
    verified = proof.verify(parsed, proof.gateway_key(log_vkey(settings)), witness_keys, 2, "d2")
    assert verified.cosigned_by == [key.name for key in witness_keys]
    # aics-tlog, another implementation: the leaf (the JWS), its index, the proof and the witnessed note.
    (tmp_path / "leaf").write_bytes(parsed.extra)
    (tmp_path / "proof").write_text("".join(base64.b64encode(hash_).decode() + "\n" for hash_ in parsed.hashes))
    (tmp_path / "note").write_bytes(parsed.note)
    common = ["--index", str(parsed.index), "--checkpoint", str(tmp_path / "note"), "--proof", str(tmp_path / "proof"),
              "--quorum", "2", "--origin", origin, *[arg for listed in witnesses[:2] for arg in ("--witness-key", listed.vkey)]]
    done = aics_tlog("verify-inclusion", "--leaf", str(tmp_path / "leaf"), "--log-key", log_vkey(settings), *common)
    assert done.returncode == 0, done.stdout + done.stderr
    # ... and it refuses one byte changed in the leaf, and another log key.
    (tmp_path / "other-leaf").write_bytes(parsed.extra[:-1] + bytes([parsed.extra[-1] ^ 1]))
    assert aics_tlog("verify-inclusion", "--leaf", str(tmp_path / "other-leaf"), "--log-key", log_vkey(settings), *common).returncode != 0
    other = log_vkey(settings, SigningIdentity(keys.generate_pem("ed25519")))
    assert aics_tlog("verify-inclusion", "--leaf", str(tmp_path / "leaf"), "--log-key", other, *common).returncode != 0


# --- The Run ledger, witnessed by the same witnesses ------------------------------------------


async def test_the_run_ledger_is_witnessed_too_woken_by_each_entry(
    settings: config.Settings, witnesses: list[servers.Witness], origin: str, running: Callable, unswept: None
) -> None:
    settings = trusted_by(settings, origin, witnesses[:2])
    gateway = await running(settings)

    async def ledger_at(size: int) -> bool:
        return await witnessed_size(gateway, "/ledger") == size

    await wait_for(functools.partial(ledger_at, 1), "the instructions entry witnessed")
    # A Run's start as the Signal Worker writes it: its entry wakes the ledger's collector.
    await runs(gateway, 2)
    await wait_for(functools.partial(ledger_at, 3), "the Runs' entries witnessed")
    async with client(gateway) as agent:
        response = await agent.get("/ledger/checkpoint/witnessed")
        await publish(agent, 1)
    text, lines = response.content.split(b"\n\n", 1)
    text += b"\n"
    ledger = service.ledger_signer(settings, gateway.identity)
    assert note.Checkpoint.parse(text).origin == ledger.origin == origin + "/ledger"
    for listed, line in zip(witnesses[:2], lines.split(b"\n")[1:-1]):
        assert witness.cosignature_of(witness.WitnessKey.parse(listed.vkey), text, line + b"\n") is not None
        name = witness.WitnessKey.parse(listed.vkey).name
        assert metrics.witness_cosigned_size.labels("ledger", name)._value.get() == 3  # type: ignore[attr-defined]
    # The Decision log's collector works beside it, on its own tree.
    await witnessed_at(gateway, 1, "the Decision log witnessed at 1")
    assert await witnessed_size(gateway, "/ledger") == 3
