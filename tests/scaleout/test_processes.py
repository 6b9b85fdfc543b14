"""Scale-out with real processes: three ``agent-gateway serve`` on one PostgreSQL database.

Every test starts its processes from one ``agent-gateway init`` folder (one
signing key, one configuration), each on its own ports, all with the default
role (both HTTP servers, the Signal Worker and the Scheduler). The agent is
:data:`RECORDING_AGENT`: it appends ``start``/``end`` lines to a file, so the
tests see which process ran each Run (it is given that process's name) and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from agent_gateway import clock
from agent_gateway import deployment as deployment_files
from agent_gateway.auth import service as auth_service
from agent_gateway.config import ScryptCost
from agent_gateway.scheduler import service as scheduler_service
from agent_gateway.signals import service as signals_service
from agent_gateway.store.engine import Store, libpq_dsn
from agent_gateway.users import service as users_service
from agent_gateway.transparency.note import Checkpoint
from tests import served
from tests.test_merkle import mth
from tests.messages.records import assert_error, stored_signals
from tests.messages.test_races import assert_numbered_1_to_k

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]

PROCESSES = 3
# A Prompt (a Message's text) on which the recording agent hangs and never writes "end".
HANG = "hang-here"
# A guard against a hung test, not a measurement (bench/scaleout.py measures failover).
DEADLINE_S = 300

RECORDING_AGENT = f"""\
import os, sys, time
HANG = {HANG!r}
record, run_id = sys.argv[1], sys.argv[2]
prompt = sys.stdin.read()

def note(what):
    with open(record, "a") as file:
        file.write(f"{{what}} {{run_id}} {{time.time():.6f}} {{os.getpid()}} {{os.environ['SCALEOUT_SERVE']}} {{prompt}}\\n")

note("start")
if prompt == HANG:
    while True:
        time.sleep(60)
time.sleep(0.05)
note("end")
"""


@dataclasses.dataclass(frozen=True)
class Note:
    what: str  # "start" or "end"
    run_id: str
    at: float  # time.time() in the agent
    pid: int  # in the agent's own PID namespace, when confined
    ppid: int  # the gateway process that ran the agent: the worker's leader
    prompt: str


@dataclasses.dataclass
class Deployment:
    """The running processes of one deployment, and what its agent recorded."""

    processes: list[served.ServedGateway]
    agent: Path
    record: Path
    database_url: str

    def notes(self) -> list[Note]:
        """What the agent recorded; which process ran it is the SCALEOUT_SERVE it was given
        (runtime.env_pass: a confined agent cannot see its parent), mapped to that process's pid."""
        if not self.record.exists():
            return []
        pids = {process.env["SCALEOUT_SERVE"]: process.process.pid for process in self.processes}
        notes = []
        for line in self.record.read_text().splitlines():
            what, run_id, at, pid, serve, prompt = line.split(" ", 5)
            notes.append(Note(what, run_id, float(at), int(pid), pids[serve], prompt))
        return notes

    def agent_pid(self, run_id: str) -> int:
        """The pid, as this host sees it, of the live agent program of Run ``run_id``."""
        wanted = [str(self.agent).encode(), str(self.record).encode(), run_id.encode()]
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[1:4] == wanted:
                    return int(entry.name)
        raise AssertionError(f"no agent program of Run {run_id} runs")

    async def token(self) -> tuple[str, str]:
        """A new User and a Token of theirs, by the operator-side operations (CLI start-up is slow)."""
        store = Store(self.database_url)
        try:
            async with store.transaction() as conn:
                user = await users_service.admit(conn)
                issued = await auth_service.issue_token(conn, user.id, ttl_ms=3_600_000)
        finally:
            await store.close()
        return user.id, issued.token


@contextlib.contextmanager
def deployment(directory: Path, database_url: str) -> Iterator[Deployment]:
    """:data:`PROCESSES` ``serve`` processes of one deployment, started at once, stopped at the end."""
    deployment_files.write(directory)  # what `agent-gateway init` writes, without a CLI start-up
    # The agent's own folder: confined, it may write there (runtime.sandbox_rw) and nowhere else but its Workspace.
    (directory / "agent-files").mkdir()
    agent = directory / "agent-files" / "agent.py"
    agent.write_text(RECORDING_AGENT)
    record = directory / "agent-files" / "runs.log"
    common = {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10",
        "AGENT_GATEWAY_RUNTIME_MODE": "per-run",  # init configures the persistent runtime
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, str(agent), str(record), "{run_id}"]),
        "AGENT_GATEWAY_RUNTIME_SANDBOX_RW": json.dumps([str(record.parent)]),
        "AGENT_GATEWAY_RUNTIME_ENV_PASS": '["SCALEOUT_SERVE"]',
        "AGENT_GATEWAY_HANDLERS": json.dumps({"message.received": {"template": "{{ text }}"}}),
    }

    def spawn(_: int) -> served.ServedGateway:
        # A free port can be taken by someone else before serve binds it: then take others.
        attempts = 3
        while True:
            attempts -= 1
            ports = {
                "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{served.free_port()}",
                "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{served.free_port()}",
            }
            try:
                tag = {"SCALEOUT_SERVE": ports["AGENT_GATEWAY_PUBLIC_LISTEN"]}
                return served.ServedGateway.spawn(directory, {**common, **ports, **tag})
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or not attempts:
                    raise

    with ThreadPoolExecutor(PROCESSES) as pool:
        futures = [pool.submit(spawn, n) for n in range(PROCESSES)]
    started = [future.result() for future in futures if future.exception() is None]
    try:
        assert len(started) == PROCESSES, [str(future.exception()) for future in futures]
        yield Deployment(started, agent, record, database_url)
    finally:
        for process in started:
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGTERM)
        for process in started:
            process.stop()


async def running_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped yet has ended too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = DEADLINE_S) -> None:
    """Wait until the (async) ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def signals_of_kind(client: httpx.AsyncClient, process: served.ServedGateway, kind: str) -> list[dict]:
    response = await client.get(f"{process.agent_url}/signals", params={"kind": kind, "limit": "200"})
    assert response.status_code == 200, response.text
    return response.json()["signals"]


def assert_serial(notes: list[Note], *, killed_at: float | None = None) -> None:
    """No two Runs overlap, whichever process ran them; a Run with no end lasted until ``killed_at``."""
    intervals = {note.run_id: [note.at, killed_at] for note in notes if note.what == "start"}
    for note in notes:
        if note.what == "end":
            intervals[note.run_id][1] = note.at
    assert None not in (end for _, end in intervals.values()), "a Run never ended"
    ordered = sorted(intervals.values())
    for (_, end), (next_start, _) in itertools.pairwise(ordered):
        assert end <= next_start, f"Runs overlap: {ordered}"


async def whole_ledger(client: httpx.AsyncClient, process: served.ServedGateway) -> list[dict]:
    """Every entry of the Run ledger, checked gap-free from 1 and to rebuild its signed checkpoint's root."""
    entries = (await client.get(f"{process.agent_url}/ledger/entries", params={"after": "0", "limit": "200"})).json()["entries"]
    assert [entry["seq"] for entry in entries] == list(range(1, len(entries) + 1))
    signed = (await client.get(f"{process.agent_url}/ledger/checkpoint")).content
    checkpoint = Checkpoint.parse(signed[: signed.index(b"\n\n") + 1])
    assert (checkpoint.size, checkpoint.root) == (len(entries), mth([entry["leaf"].encode() for entry in entries]))
    return entries


async def test_three_processes_share_one_database(tmp_path: Path, database_url: str) -> None:
    with deployment(tmp_path / "deployment", database_url) as gateway:
        processes = gateway.processes
        # The operator's commands, beside the three processes: a User and a real Token.
        user_id = processes[0].cli_json("users", "add")["id"]
        token = processes[0].cli_json("tokens", "issue", user_id)["token"]
        async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
            # Each process answers, for the User admitted beside them and the Token issued beside them.
            for process in processes:
                me = await client.get(f"{process.public_url}/users/me", headers=bearer(token))
                assert me.status_code == 200, me.text
                assert me.json()["id"] == user_id
                read = await client.get(f"{process.agent_url}/users/{user_id}")
                assert read.json() == me.json()

            # A Token from a login through one process works through another; revoked through a
            # third, it stops working everywhere (nothing is cached per process).
            store = Store(database_url)
            try:
                async with store.transaction() as conn:
                    await auth_service.set_password(conn, user_id, "pass word", cost=ScryptCost(log_n=10))
            finally:
                await store.close()
            login = await client.post(
                f"{processes[1].public_url}/auth/tokens", json={"user": user_id, "password": "pass word"}
            )
            assert login.status_code == 201, login.text
            session = login.json()["token"]
            assert (await client.get(f"{processes[2].public_url}/users/me", headers=bearer(session))).status_code == 200
            revoke = await client.delete(f"{processes[0].public_url}/auth/tokens/current", headers=bearer(session))
            assert revoke.status_code == 204
            for process in processes:
                assert_error(await client.get(f"{process.public_url}/users/me", headers=bearer(session)), 401)

            # Inbound Messages spread over the three Public servers make one log, read alike through each.
            created = []
            for n in range(3 * PROCESSES):
                process = processes[n % PROCESSES]
                response = await client.post(
                    f"{process.public_url}/messages", json={"text": f"m{n}"}, headers=bearer(token)
                )
                assert response.status_code == 201, response.text
                created.append(response.json())
            assert [m["seq"] for m in created] == list(range(1, len(created) + 1))
            for process in processes:
                log = await client.get(f"{process.public_url}/messages", headers=bearer(token))
                assert log.json()["messages"] == created

            # Each Message's Signal ran once, one Run at a time across the three (one active worker).
            async def all_done() -> bool:
                signals = await signals_of_kind(client, processes[2], "message.received")
                return len(signals) == len(created) and all(s["state"] == "done" for s in signals)

            await until(all_done)
            # The Run ledger the three write: one instructions entry (they started at once, told
            # alike), then one entry per Run, numbered from 1 without a gap, none twice.
            entries = await whole_ledger(client, processes[1])
            assert [entry["seq"] for entry in entries] == list(range(1, len(created) + 2))
            assert [entry["kind"] for entry in entries] == ["instructions"] + ["run"] * len(created)
    notes = gateway.notes()
    starts = [note for note in notes if note.what == "start"]
    assert sorted(note.prompt for note in starts) == sorted(m["text"] for m in created)
    assert len({note.run_id for note in starts}) == len(created)
    assert {json.loads(entry["leaf"])["run"] for entry in entries[1:]} == {note.run_id for note in starts}
    assert {note.ppid for note in starts} <= {p.process.pid for p in processes}
    assert_serial(notes)


async def test_worker_failover_when_the_leader_is_killed_mid_run(tmp_path: Path, database_url: str) -> None:
    with deployment(tmp_path / "deployment", database_url) as gateway:
        processes = gateway.processes
        _, token = await gateway.token()
        texts = ["before-1", "before-2", HANG, "after-1", "after-2", "after-3"]
        async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
            messages = []
            for n, text in enumerate(texts):
                process = processes[n % PROCESSES]
                response = await client.post(
                    f"{process.public_url}/messages", json={"text": text}, headers=bearer(token)
                )
                assert response.status_code == 201, response.text
                messages.append(response.json())

            async def hanging() -> bool:
                return any(note.prompt == HANG for note in gateway.notes())

            await until(hanging)
            [hung] = [note for note in gateway.notes() if note.prompt == HANG]
            hung_pid = gateway.agent_pid(hung.run_id)
            [leader] = [p for p in processes if p.process.pid == hung.ppid]
            leader.process.send_signal(signal.SIGKILL)
            killed_at = time.time()
            leader.process.wait()
            try:
                # The killed gateway's agent dies with it: it would run on beside the next leader's Runs.
                await until(lambda: running_gone(hung_pid))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hung_pid, signal.SIGKILL)
            standbys = [p for p in processes if p is not leader]

            async def resumed() -> bool:
                return any(note.at > killed_at for note in gateway.notes() if note.what == "start")

            await until(resumed)

            by_text = {m["text"]: m for m in messages}

            async def all_ended() -> bool:
                signals = await signals_of_kind(client, standbys[0], "message.received")
                return len(signals) == len(texts) and all(s["state"] in ("done", "failed") for s in signals)

            await until(all_ended)
            # One ledger, written by the killed leader and then by the next (whose own last entry,
            # if any, is no longer the newest): every Run started has its entry, the tree holds them.
            entries = await whole_ledger(client, standbys[0])
            assert [entry["kind"] for entry in entries].count("run") == len(texts)
            signals = {s["payload"]["id"]: s for s in await signals_of_kind(client, standbys[1], "message.received")}
            runs = {}
            for message_id, signal_ in signals.items():
                response = await client.get(f"{standbys[0].agent_url}/runs", params={"signalId": signal_["id"]})
                runs[message_id] = response.json()["runs"]

    killed = signals[by_text[HANG]["id"]]
    assert (killed["state"], killed["error"]) == ("failed", signals_service.STOPPED_SIGNAL_ERROR)
    [killed_run] = runs[by_text[HANG]["id"]]
    assert (killed_run["id"], killed_run["state"]) == (hung.run_id, "failed")

    notes = gateway.notes()
    starts = Counter(note.prompt for note in notes if note.what == "start")
    assert starts == Counter(texts), "a Signal ran twice or not at all"
    for text in texts:
        if text == HANG:
            continue
        assert signals[by_text[text]["id"]]["state"] == "done"
        [run] = runs[by_text[text]["id"]]
        assert run["state"] == "done"
        assert [note.what for note in notes if note.run_id == run["id"]] == ["start", "end"]
    after = [note for note in notes if note.what == "start" and note.at > killed_at]
    assert {note.prompt for note in after} == {"after-1", "after-2", "after-3"}
    assert {note.ppid for note in after} < {p.process.pid for p in standbys}

    # The killed Run lasted from its start until its leader died.
    assert_serial(notes, killed_at=killed_at)
    output = "".join(p.output() for p in standbys)
    assert f"Signal {killed['id']} failed: left processing by a stopped process, not re-run" in output


async def test_each_schedule_fires_once_across_three_schedulers(tmp_path: Path, database_url: str) -> None:
    count = 200
    with deployment(tmp_path / "deployment", database_url) as gateway:
        processes = gateway.processes
        names = [f"s{n:03d}" for n in range(count)]
        due: dict[str, str] = {}
        sending = asyncio.Semaphore(30)
        # Its idle connections dropped well before the server's (http.idle_timeout_ms, 5 s, httpx's
        # default expiry too): on a starved machine a request reused one the server was closing.
        limits = httpx.Limits(max_connections=30, keepalive_expiry=1)
        async with httpx.AsyncClient(timeout=DEADLINE_S, limits=limits) as client:

            async def put(n: int, name: str) -> httpx.Response:
                async with sending:
                    deadline = time.monotonic() + DEADLINE_S
                    while True:
                        # Due ten seconds after it is sent (the clock read as the request leaves), so
                        # fires of the first Schedules overlap the PUTs of the later ones.
                        due[name] = clock.format_instant(clock.now() + timedelta(seconds=10))
                        body = {"spec": {"kind": "once", "at": due[name]}, "data": {"n": n}}
                        response = await client.put(f"{processes[n % PROCESSES].agent_url}/schedules/{name}", json=body)
                        # A 503 recorded nothing and says retry (spec): a starved machine gives some.
                        # So does a time already past when the gateway read it: on a starved machine
                        # the request can take longer than the ten seconds to be handled.
                        again = response.status_code == 503 or (
                            response.status_code == 400 and "already past" in response.json()["message"]
                        )
                        if not again or time.monotonic() > deadline:
                            return response
                        await asyncio.sleep(0.1)

            responses = await asyncio.gather(*(put(n, name) for n, name in enumerate(names)))
            assert [r.status_code for r in responses] == [201] * count, [
                r.text for r in responses if r.status_code != 201
            ][:3]

            async def all_fired() -> bool:
                for process in processes:
                    left = await client.get(f"{process.agent_url}/schedules", params={"limit": "200"})
                    if left.status_code == 503:  # a starved machine: nothing read, ask again (spec)
                        return False
                    assert left.status_code == 200, left.text
                    if left.json()["schedules"]:
                        return False
                return True

            await until(all_fired)
            listed = await signals_of_kind(client, processes[1], scheduler_service.FIRED_KIND)
        store = Store(database_url)
        try:
            stored = [s for s in await stored_signals(store) if s["kind"] == scheduler_service.FIRED_KIND]
        finally:
            await store.close()
    assert Counter(s["payload"]["scheduleName"] for s in stored) == Counter(due.keys()), (
        "an occurrence fired twice or never"
    )
    assert sorted(s["payload"]["scheduleName"] for s in listed) == sorted(due)
    for fired in listed:
        payload = fired["payload"]
        assert payload["scheduledFor"] == due[payload["scheduleName"]]
        assert payload["data"] == {"n": int(payload["scheduleName"][1:])}


async def test_concurrent_inbound_messages_for_one_user_through_three_processes(
    tmp_path: Path, database_url: str
) -> None:
    writers = 60
    with deployment(tmp_path / "deployment", database_url) as gateway:
        processes = gateway.processes
        _, token = await gateway.token()
        async with httpx.AsyncClient(timeout=DEADLINE_S, limits=httpx.Limits(max_connections=writers)) as client:

            async def write(n: int) -> httpx.Response:
                url = f"{processes[n % PROCESSES].public_url}/messages"
                return await client.post(url, json={"text": f"m{n}"}, headers=bearer(token))

            responses = await asyncio.gather(*(write(n) for n in range(writers)))
            read = await client.get(
                f"{processes[0].public_url}/messages", params={"limit": "200"}, headers=bearer(token)
            )
        for response in responses:
            if response.status_code == 503:
                assert_error(response, 503)
        created = [r.json() for r in responses if r.status_code == 201]
        log = read.json()["messages"]
        assert_numbered_1_to_k([r.status_code for r in responses], created, log)
        assert created, "no write succeeded"
        # Each stored Message has exactly one Signal; a refused write left none.
        store = Store(database_url)
        try:
            payloads = [s["payload"] for s in await stored_signals(store) if s["kind"] == "message.received"]
        finally:
            await store.close()
        assert sorted(payloads, key=lambda m: m["seq"]) == log


def restart_postgresql() -> None:
    """Restart the one PostgreSQL server (everyone's): returns once it accepts connections again."""
    version = os.listdir("/etc/postgresql")[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


async def postgresql_answers(database_url: str) -> bool:
    try:
        conn = await asyncpg.connect(libpq_dsn(database_url), timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


# What a request may meet while PostgreSQL restarts: an answer within this long, never a hang.
REQUEST_TIMEOUT_S = 60


@pytest.mark.restarts_postgresql
async def test_a_postgresql_restart_mid_traffic_is_survived_without_a_gateway_restart(
    tmp_path: Path, database_url: str
) -> None:
    """Writes (outbound Messages) and authenticated reads through every process while PostgreSQL restarts."""
    with deployment(tmp_path / "deployment", database_url) as gateway:
        processes = gateway.processes
        pids = [p.process.pid for p in processes]
        user_id, token = await gateway.token()
        outcomes: list[tuple[str, int | str, dict | None]] = []
        restarted = asyncio.Event()
        written_after: set[int] = set()

        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:

            async def request(index: int, n: int) -> httpx.Response:
                if n % 2:
                    return await client.get(f"{processes[index].public_url}/users/me", headers=bearer(token))
                body = {"userId": user_id, "text": f"t{n}"}
                return await client.post(f"{processes[index].agent_url}/messages", json=body)

            async def traffic(lane: int) -> None:
                # Through every process, until each has acknowledged a write after the restart.
                n = lane
                while len(written_after) < PROCESSES:
                    index, n = n % PROCESSES, n + 1
                    kind = "read" if n % 2 else "write"
                    try:
                        response = await request(index, n)
                    except httpx.TimeoutException:
                        outcomes.append((kind, "timeout", None))
                        raise
                    except httpx.TransportError as exc:
                        outcomes.append((kind, type(exc).__name__, None))
                        continue
                    outcomes.append((kind, response.status_code, response.json()))
                    if restarted.is_set() and response.status_code == 201:
                        written_after.add(index)
                    await asyncio.sleep(0.01)

            lanes = [asyncio.create_task(traffic(lane)) for lane in range(4)]
            try:
                await asyncio.sleep(1)
                await asyncio.to_thread(restart_postgresql)
                restarted.set()
                await asyncio.wait_for(asyncio.gather(*lanes), DEADLINE_S)
            finally:
                for lane in lanes:
                    lane.cancel()
                await asyncio.gather(*lanes, return_exceptions=True)
                # Never leave the server down for everyone else using it.
                await until(lambda: postgresql_answers(database_url), timeout=120)

            # The listeners reconnected: a new inbound Message still wakes the worker and gets a Run.
            inbound = await client.post(
                f"{processes[1].public_url}/messages", json={"text": "after"}, headers=bearer(token)
            )
            assert inbound.status_code == 201, inbound.text

            async def ran() -> bool:
                return any(note.prompt == "after" and note.what == "end" for note in gateway.notes())

            await until(ran)
            stored: list[dict] = []
            while True:
                params = {"user": user_id, "limit": "200", "after": str(stored[-1]["seq"] if stored else 0)}
                page = (await client.get(f"{processes[2].agent_url}/messages", params=params)).json()["messages"]
                stored += page
                if len(page) < 200:
                    break
        # Each listener reconnects after its own back-off, which a busy machine may stretch past
        # the traffic's end: wait for every one of them.
        async def listeners_reconnected() -> bool:
            return all("notification listener reconnected" in p.output() for p in processes)

        await until(listeners_reconnected)
        assert [p.process.poll() for p in processes] == [None] * PROCESSES, "a process died"
        assert [p.process.pid for p in processes] == pids

    statuses = Counter((kind, status) for kind, status, _ in outcomes)
    assert set(statuses) <= {("read", 200), ("read", 503), ("write", 201), ("write", 503)}, statuses
    assert statuses["read", 503] + statuses["write", 503] >= 1, f"no request met the outage: {statuses}"
    for _, status, body in outcomes:
        if status == 503:
            assert body is not None and set(body) == {"statusCode", "error", "message"}
    # Nothing acknowledged is lost, and the log stays numbered 1..k.
    acknowledged = {body["id"] for _, status, body in outcomes if status == 201}  # type: ignore[index]
    assert acknowledged <= {m["id"] for m in stored}
    assert [m["seq"] for m in stored] == list(range(1, len(stored) + 1))
