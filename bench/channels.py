"""Chat channels (issue 36 §4): a Message's round trip through Matrix against the Public server's,
inbound throughput from one busy room, outbound delivery rate, and the outbox row's cost.

    python -m bench.channels                           # every scenario, SQLite
    python -m bench.channels --backend postgresql --samples 100

Everything runs in this process but the homeserver: a real Synapse from PyPI (tests/servers.py,
SQLite, loopback), one in-process gateway whose runtime is the echo agent's answer posted in
process (tests/channels/conftest.EchoRuntime), and a person's matrix-nio client.

Scenarios:
  roundtrip  one Message at a time, ``--samples`` times: through the Public server (POST
             /messages on the in-process ASGI app, the answer seen by the User's Message
             channel's wake-up, as a stream sees it) and through Matrix (the person's
             ``room_send``, the answer seen by their long-polling sync). p50/p99 of each; the
             difference is the channel's added cost (target <= 50 ms p50).
  inbound    the person writes ``--burst`` messages as fast as the homeserver takes them, in one
             room: messages stored per second, from the first send to the last one stored.
  outbound   ``--burst`` outbound Messages written at once: deliveries per second, from the
             first write to the last one delivered.
  cost       5 x ``--burst`` outbound Messages written 16 at a time (the writer batches them),
             for a User with a Matrix conversation, with the channel served (an outbox row
             each) and without, in ``--rounds`` alternating rounds: the first's best rate as a
             share of the second's, and the same by median CPU per Message (this process's
             and the PostgreSQL server's) (target >= 90 %).
  homeserver (not in ``all``; no gateway) two Synapses side by side: the tests' (with the
             settings docs/operate/channels.md recommends: presence, room statistics and the
             federation sender off) and one with Synapse's defaults for those three; in
             ``--rounds`` alternating rounds of ``--samples`` cycles each, one person sends
             a message and another's long-polling sync sees it: the homeserver's CPU per
             cycle (from /proc) and the cycle's p50, of each.
  nostr      (not in ``all``; a real nostr-relay from PyPI instead of Synapse) one Message at a
             time through Nostr (the person's gift-wrapped DM published on the relay, the
             answer seen on their open subscription there) and through the Public server,
             in alternating rounds on one gateway, ``--samples`` each: p50/p99 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
import nio
import sqlalchemy as sa

from agent_gateway import config
from agent_gateway.channels import inbound
from agent_gateway.gateway import Gateway
from agent_gateway.messages import service as messages
from agent_gateway.store import migrate
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.store.tables import messages as message_rows
from agent_gateway.auth import service as auth_service
from agent_gateway.signatures import keys
from bench import harness
from tests import servers
from tests.channels.conftest import HANDLERS, EchoRuntime, Person

CEILING_S = 300.0


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + CEILING_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def line(label: str, samples: list[float]) -> str:
    return f"{label:<28} p50 {percentile(samples, 50) * 1000:7.1f} ms   p99 {percentile(samples, 99) * 1000:7.1f} ms   (n={len(samples)})"


@dataclasses.dataclass
class Bench:
    homeserver: servers.Homeserver | None
    folder: Path
    database_url: str

    async def gateway(self, **changes: object) -> Gateway:
        assert self.homeserver is not None
        agent, token = self.homeserver.register()
        token_file = self.folder / f"token-{agent[1:8]}"
        token_file.write_text(token)
        return await self.start(
            matrix_homeserver=self.homeserver.url, matrix_user_id=agent, matrix_access_token_file=token_file,
            matrix_policy="open", **changes,
        )

    async def start(self, **changes: object) -> Gateway:
        """An in-process gateway with the echo agent, serving what ``changes`` set."""
        key = self.folder / "signing-key.pem"
        if not key.exists():
            keys.write_private(key, keys.generate_pem("ed25519"))
        settings = config.Settings(
            token_ttl_ms=3_600_000, database_url=self.database_url, signing_key_file=key,
            scrypt=config.ScryptCost(log_n=4), handlers=HANDLERS, ops_listen=None,
        )
        gateway = Gateway(dataclasses.replace(settings, **changes))  # type: ignore[arg-type]
        runtime = EchoRuntime()
        runtime.gateway = gateway
        gateway.runtime = runtime
        await gateway.start()
        return gateway


async def stored(gateway: Gateway, user_id: str, direction: str) -> int:
    async with gateway.store.read() as conn:
        query = sa.select(sa.func.count()).where(message_rows.c.user_id == user_id, message_rows.c.direction == direction)
        return int((await conn.execute(query)).scalar() or 0)


async def roundtrip(bench: Bench, samples: int) -> None:
    gateway = await bench.gateway()
    person = Person(bench.homeserver)
    agent = gateway.settings.matrix_user_id or ""
    try:
        room = await person.direct_room(agent)

        async def agent_joined() -> bool:
            return agent in await person.members(room)

        await until(agent_joined, "the agent joining")
        first = await person.client.sync(timeout=0)
        assert isinstance(first, nio.SyncResponse)
        since = first.next_batch
        matrix_times: list[float] = []
        own_times: list[float] = []
        marks = Marks(gateway)
        assert bench.homeserver is not None
        homeserver_pid = bench.homeserver.running.process.pid
        cpu = (harness.cpu_s(homeserver_pid), time.process_time())
        for n in range(samples + 1):
            started = time.perf_counter()
            await person.say(room, f"m{n}")
            while True:
                answer = await person.client.sync(timeout=30_000, since=since)
                assert isinstance(answer, nio.SyncResponse)
                since = answer.next_batch
                joined = answer.rooms.join.get(room)
                if joined and any(e.sender == agent and getattr(e, "body", "") == f"echo: m{n}" for e in joined.timeline.events):
                    break
            if n:  # the first one joins the room and admits the User
                matrix_times.append(time.perf_counter() - started)
                own_times.append(marks.own(started))
        marks.close()
        homeserver_cpu = (harness.cpu_s(homeserver_pid) - cpu[0]) / (samples + 1)
        own_cpu = (time.process_time() - cpu[1]) / (samples + 1)
        async with gateway.store.transaction() as conn:
            from agent_gateway.users import service as users

            user_id = (await users.admit(conn)).id
            issued = await auth_service.issue_token(conn, user_id, ttl_ms=3_600_000)
        headers = {"Authorization": f"Bearer {issued.token}"}
        public_times: list[float] = []
        wake = gateway.store.subscribe(messages.channel(user_id))
        transport = httpx.ASGITransport(app=gateway.public_asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
            for n in range(samples):
                started = time.perf_counter()
                sent = await client.post("/messages", json={"text": f"p{n}"}, headers=headers)
                assert sent.status_code == 201, sent.text
                while await stored(gateway, user_id, "outbound") < n + 1:
                    await wake.wait(1.0)
                public_times.append(time.perf_counter() - started)
        print(line("round trip, Public server", public_times))
        print(line("round trip, Matrix", matrix_times))
        added = statistics.median(matrix_times) - statistics.median(public_times)
        print(f"{'added by the channel (p50)':<28} {added * 1000:7.1f} ms   (target <= 50 ms)")
        print(line("  of it in the gateway", own_times))
        print(f"{'  and in the homeserver (p50)':<28} {(statistics.median(matrix_times) - statistics.median(own_times)) * 1000:7.1f} ms")
        print(f"{'CPU per Matrix round trip':<28} {homeserver_cpu * 1000:7.1f} ms the homeserver's, {own_cpu * 1000:.1f} ms this process's (the gateway and the person's client)")
    finally:
        await person.close()
        await gateway.stop()


class Marks:
    """Where a Matrix round trip's time goes: the gateway's share runs from the moment the
    channel takes the person's message from a sync (``inbound.record``) to the moment it
    starts sending the answer (``Matrix.send``); the rest is the homeserver's (two sends,
    two syncs) and the clients'. Timed by wrapping the two calls, for this bench only."""

    def __init__(self, gateway: Gateway) -> None:
        self.taken: list[float] = []
        self.sending: list[float] = []
        self._record = inbound.record
        network = gateway.channels[0].network
        send = network.send

        async def record(*args: object, **kwargs: object) -> list[str]:
            if args[3]:  # a sync that brought messages
                self.taken.append(time.perf_counter())
            return await self._record(*args, **kwargs)  # type: ignore[arg-type]

        async def sending(*args: object) -> None:
            self.sending.append(time.perf_counter())
            await send(*args)  # type: ignore[arg-type]

        inbound.record = record  # type: ignore[assignment]
        network.send = sending  # type: ignore[method-assign]

    def own(self, started: float) -> float:
        taken = min(mark for mark in self.taken if mark > started)
        return min(mark for mark in self.sending if mark > taken) - taken

    def close(self) -> None:
        inbound.record = self._record  # type: ignore[assignment]


async def inbound_and_outbound(bench: Bench, burst: int) -> None:
    gateway = await bench.gateway()
    person = Person(bench.homeserver)
    agent = gateway.settings.matrix_user_id or ""
    try:
        room = await person.direct_room(agent)

        async def agent_joined() -> bool:
            return agent in await person.members(room)

        await until(agent_joined, "the agent joining")  # what is written before it joins is never read
        await person.say(room, "hello")
        user_id = ""

        async def admitted() -> bool:
            nonlocal user_id
            async with gateway.store.read() as conn:
                found = await channel_queries.identity(conn, f"matrix:{person.user_id}")
            user_id = found.user_id if found else ""
            return bool(found)

        await until(admitted, "the person admitted")
        await until(lambda: _at_least(stored(gateway, user_id, "outbound"), 1), "the first answer")
        gateway.runtime = _Silent()  # inbound alone: no answers competing
        started = time.perf_counter()
        for n in range(burst):
            await person.say(room, f"b{n}")
        await until(lambda: _at_least(stored(gateway, user_id, "inbound"), burst + 1), "the burst stored")
        took = time.perf_counter() - started
        print(f"{'inbound, one busy room':<28} {burst / took:7.1f} Messages stored/s   ({burst} in {took:.2f} s)")

        started = time.perf_counter()
        async with gateway.store.transaction() as conn:
            await messages.append_many(conn, [messages.Draft(user_id, messages.OUTBOUND, f"o{n}") for n in range(burst)])

        async def all_sent() -> bool:
            async with gateway.store.read() as conn:
                return await channel_queries.depth(conn, channel="matrix") == 0

        await until(all_sent, "the outbound burst delivered")
        took = time.perf_counter() - started
        print(f"{'outbound delivery':<28} {burst / took:7.1f} deliveries/s   ({burst} in {took:.2f} s)")
    finally:
        await person.close()
        await gateway.stop()


class _Silent:
    async def run(self, run: object) -> None:
        return None


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n


async def cost(bench: Bench, burst: int, rounds: int) -> None:
    from agent_gateway.channels import identities
    from agent_gateway.store.engine import Store
    from agent_gateway.users import service as users

    store = Store(bench.database_url)
    try:
        async with store.transaction() as conn:
            user_id = (await users.admit(conn)).id
            await identities.link(conn, user_id, "matrix:@someone:localhost")
            received = await messages.receive(conn, user_id, "hi")
            await channel_queries.set_conversation(conn, channel_queries.Conversation(
                user_id, "matrix", "matrix:@someone:localhost", "!nowhere:localhost", received.seq, received.created_at
            ))
    finally:
        await store.close()
    # Rows written, none sent (no gateway runs the channel): the cost of the outbox row itself,
    # in alternating rounds: each configuration's best rate, and its median CPU per Message
    # (this process's and, on PostgreSQL, the database server's for this database), which a
    # busy machine disturbs less than the rate.
    rates: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    for served in (frozenset({"matrix"}), frozenset()) * rounds:
        store = Store(bench.database_url)
        store.channels = served
        try:
            writer = messages.Writer(store)
            await writer.send(user_id, "warm")  # connections opened before the clock starts
            cpu = time.process_time() + await database_cpu(bench.database_url)
            started = time.perf_counter()
            for start in range(0, burst, 16):  # 16 writers at a time, as wrk -c16 would
                await asyncio.gather(*(writer.send(user_id, f"c{n}") for n in range(start, min(burst, start + 16))))
            rates[bool(served)].append(burst / (time.perf_counter() - started))
            cpus[bool(served)].append((time.process_time() + await database_cpu(bench.database_url) - cpu) / burst)
        finally:
            await store.close()
    with_channel, without = max(rates[True]), max(rates[False])
    cpu_with, cpu_without = statistics.median(cpus[True]), statistics.median(cpus[False])
    print(f"{'outbound writes, no channel':<28} {without:9.0f} Messages/s   {cpu_without * 1e6:6.0f} us CPU each")
    print(
        f"{'outbound writes, with row':<28} {with_channel:9.0f} Messages/s   {cpu_with * 1e6:6.0f} us CPU each   "
        f"({with_channel / without:.0%} of the rate, {cpu_without / cpu_with:.0%} by CPU; target >= 90 %)"
    )


async def database_cpu(url: str) -> float:
    """The CPU seconds of the PostgreSQL server processes serving ``url``'s database (0 on SQLite)."""
    if not url.startswith("postgres"):
        return 0.0
    conn = await asyncpg.connect(url)
    try:
        pids = [row[0] for row in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
    finally:
        await conn.close()
    total = 0.0
    for pid in pids:
        try:
            total += harness.cpu_s(pid)
        except OSError:  # ended meanwhile
            pass
    return total


# Synapse's defaults for what the operator's page turns off.
SYNAPSE_DEFAULTS = "presence:\n  enabled: true\nstats:\n  enabled: true\nfederation_sender_instances: [master]\n"


@dataclasses.dataclass
class Cycles:
    """Send -> sync cycles between two people on one homeserver: its CPU and each cycle's time."""

    homeserver: servers.Homeserver
    sender: httpx.AsyncClient
    reader: httpx.AsyncClient
    room: str
    since: str
    times: list[float] = dataclasses.field(default_factory=list)
    cpu_s: float = 0.0

    @classmethod
    async def open(cls, homeserver: servers.Homeserver) -> Cycles:
        clients = []
        for user_id, token in (homeserver.register(), homeserver.register()):
            clients.append((user_id, httpx.AsyncClient(
                base_url=homeserver.url, headers={"Authorization": f"Bearer {token}"}, timeout=CEILING_S
            )))
        (_, sender), (reader_id, reader) = clients
        created = await sender.post("/_matrix/client/v3/createRoom", json={"invite": [reader_id], "is_direct": True})
        room = created.raise_for_status().json()["room_id"]
        (await reader.post(f"/_matrix/client/v3/join/{room}", json={})).raise_for_status()
        first = await reader.get("/_matrix/client/v3/sync", params={"timeout": 0})
        return cls(homeserver, sender, reader, room, first.raise_for_status().json()["next_batch"])

    async def run(self, n: int) -> None:
        pid = self.homeserver.running.process.pid
        before = harness.cpu_s(pid)
        for _ in range(n):
            sync = asyncio.create_task(self.reader.get("/_matrix/client/v3/sync", params={"timeout": 30_000, "since": self.since}))
            started = time.perf_counter()
            sent = await self.sender.put(
                f"/_matrix/client/v3/rooms/{self.room}/send/m.room.message/{time.time_ns()}", json={"msgtype": "m.text", "body": "x"}
            )
            sent.raise_for_status()
            self.since = (await sync).raise_for_status().json()["next_batch"]
            self.times.append(time.perf_counter() - started)
        self.cpu_s += harness.cpu_s(pid) - before

    async def close(self) -> None:
        await self.sender.aclose()
        await self.reader.aclose()


async def homeserver_settings(tuned: servers.Homeserver, defaults: servers.Homeserver, samples: int, rounds: int) -> None:
    both = {"the tests' (recommended)": await Cycles.open(tuned), "Synapse's defaults": await Cycles.open(defaults)}
    try:
        for _ in range(rounds):
            for cycles in both.values():
                await cycles.run(samples)
        for name, cycles in both.items():
            print(
                f"{name:<28} {cycles.cpu_s / len(cycles.times) * 1000:6.1f} ms homeserver CPU per send -> sync, "
                f"p50 {percentile(cycles.times, 50) * 1000:6.1f} ms"
            )
    finally:
        for cycles in both.values():
            await cycles.close()


async def nostr_roundtrip(bench: Bench, relay: servers.Relay, samples: int) -> None:
    """Nostr and Public server round trips in alternating rounds, on one gateway (open policy)."""
    import json
    import os

    import nostr_sdk
    from websockets.asyncio.client import connect

    from agent_gateway.channels import nostr

    key_file = bench.folder / "nostr-key"
    secret, npub = nostr.new_key()
    key_file.write_text(secret)
    os.chmod(key_file, 0o600)
    gateway = await bench.start(nostr_relays=(relay.url,), nostr_key_file=key_file, nostr_policy="open")
    agent = nostr_sdk.PublicKey.parse(npub)
    person = nostr_sdk.Keys.generate()
    try:
        async def reading() -> bool:  # what is written before the channel first reads is never taken
            async with gateway.store.read() as conn:
                return relay.url in (await channel_queries.read_position(conn, "nostr") or "")

        await until(reading, "the channel reading the relay")
        async with connect(relay.url, max_size=None) as ws:
            since = int(time.time()) - 3 * 86_400
            await ws.send(json.dumps(["REQ", "answers", {"kinds": [1059], "#p": [person.public_key().to_hex()], "since": since}]))

            async def round_trip(text: str) -> float:
                started = time.perf_counter()
                wrap = nostr_sdk.nip17_make_private_msg(person, agent, text)
                await ws.send(json.dumps(["EVENT", json.loads(wrap.as_json())]))
                async with asyncio.timeout(CEILING_S):
                    async for frame in ws:
                        message = json.loads(frame)
                        if message[:2] == ["EVENT", "answers"]:
                            event = nostr_sdk.Event.from_json(json.dumps(message[2]))
                            if nostr_sdk.UnwrappedGift.from_gift_wrap(person, event).rumor().content() == f"echo: {text}":
                                return time.perf_counter() - started
                raise ConnectionError("the relay closed the connection")

            await round_trip("hello")  # admits the User
            async with gateway.store.read() as conn:
                found = await channel_queries.identity(conn, f"nostr:{person.public_key().to_hex()}")
            assert found is not None
            async with gateway.store.transaction() as conn:
                issued = await auth_service.issue_token(conn, found.user_id, ttl_ms=3_600_000)
            headers = {"Authorization": f"Bearer {issued.token}"}
            wake = gateway.store.subscribe(messages.channel(found.user_id))
            nostr_times: list[float] = []
            public_times: list[float] = []
            transport = httpx.ASGITransport(app=gateway.public_asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
                for n in range(samples):
                    nostr_times.append(await round_trip(f"n{n}"))
                    answered = await stored(gateway, found.user_id, "outbound")
                    started = time.perf_counter()
                    sent = await client.post("/messages", json={"text": f"p{n}"}, headers=headers)
                    assert sent.status_code == 201, sent.text
                    while await stored(gateway, found.user_id, "outbound") < answered + 1:
                        await wake.wait(1.0)
                    public_times.append(time.perf_counter() - started)
        print(line("round trip, Public server", public_times))
        print(line("round trip, Nostr", nostr_times))
        added = statistics.median(nostr_times) - statistics.median(public_times)
        print(f"{'added by the channel (p50)':<28} {added * 1000:7.1f} ms")
    finally:
        await gateway.stop()


async def run(
    bench: Bench, scenario: str, samples: int, burst: int, relay: servers.Relay | None = None, rounds: int = 2
) -> None:
    await migrate.upgrade_url(bench.database_url)
    if scenario == "nostr":
        assert relay is not None
        await nostr_roundtrip(bench, relay, samples)
    if scenario in ("roundtrip", "all"):
        await roundtrip(bench, samples)
    if scenario in ("inbound", "all"):
        await inbound_and_outbound(bench, burst)
    if scenario in ("cost", "all"):
        await cost(bench, burst * 5, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--scenario", choices=("roundtrip", "inbound", "cost", "all", "nostr", "homeserver"), default="all")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="cost, homeserver: alternating rounds of each configuration")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        if options.scenario == "homeserver":
            with servers.synapse(folder / "tuned") as tuned, servers.synapse(folder / "defaults", SYNAPSE_DEFAULTS) as defaults:
                print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
                asyncio.run(homeserver_settings(tuned, defaults, options.samples, options.rounds))
                print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
            return
        if options.scenario == "nostr":
            with servers.relay(folder / "relay") as relay, harness.database(options.backend, folder) as url:
                asyncio.run(run(Bench(None, folder, url), options.scenario, options.samples, options.burst, relay))
            return
        with servers.synapse(folder / "synapse") as homeserver, harness.database(options.backend, folder) as url:
            asyncio.run(run(Bench(homeserver, folder, url), options.scenario, options.samples, options.burst, rounds=options.rounds))


if __name__ == "__main__":
    main()
