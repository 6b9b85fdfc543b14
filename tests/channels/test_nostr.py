"""The Nostr channel against a real relay (nostr-relay from PyPI), on both backends.

The people are a second nostr-sdk (keys, NIP-17 gift wraps) speaking to the relay over a
websocket of their own. Each test makes fresh keys (the agent's and the people's) on the
module's one relay, so no test sees another's messages. Every wait has a ceiling of minutes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import nostr_sdk
import pytest
import sqlalchemy as sa
from websockets.asyncio.client import connect

from agent_gateway import config
from agent_gateway.channels import identities, inbound, nostr, pairing
from agent_gateway.gateway import Gateway
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.tables import channel_pairings, messages, users
from agent_gateway.users import service as users_service
from tests import servers
from tests.channels.conftest import CEILING_S, HANDLERS, Deployment, store_and_kill, until
from tests.channels.test_matrix import all_delivered, count, has_state, log_of
from tests.served import ServedGateway, run_cli, run_cli_here

pytestmark = pytest.mark.processes



@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Relay]:
    """One relay for this module's tests (one xdist group, so one worker)."""
    with servers.required(servers.relay, tmp_path_factory.mktemp("relay"), "RELAY") as server:
        yield server


@pytest.fixture
def running_relay(relay: servers.Relay) -> Iterator[servers.Relay]:
    """The module's relay, started again after a test that stopped it."""
    yield relay
    if not relay.running.alive():
        relay.start()


class Person:
    """Someone with a Nostr key, writing and reading NIP-17 direct messages on the relay."""

    def __init__(self, relay: servers.Relay) -> None:
        self.relay = relay
        self.keys = nostr_sdk.Keys.generate()
        self.hex = self.keys.public_key().to_hex()

    async def publish(self, event: nostr_sdk.Event, relay: servers.Relay | None = None) -> None:
        async with connect((relay or self.relay).url) as ws:
            await ws.send(json.dumps(["EVENT", json.loads(event.as_json())]))
            async for frame in ws:
                answer = json.loads(frame)
                if answer[0] == "OK":
                    assert answer[2] is True, answer
                    return

    async def say(self, agent: str, text: str, at: int | None = None, sealed_by: nostr_sdk.Keys | None = None) -> None:
        """A kind 14 rumor to ``agent``, written ``at`` (now), sealed by this person (or ``sealed_by``)."""
        recipient = nostr_sdk.PublicKey.parse(agent)
        rumor = (
            nostr_sdk.EventBuilder(nostr_sdk.Kind(14), text).tags([nostr_sdk.Tag.public_key(recipient)])
            .custom_created_at(nostr_sdk.Timestamp.from_secs(at or int(time.time())))
            .finalize_unsigned(self.keys.public_key())
        )
        await self.publish(nostr_sdk.nip59_make_gift_wrap(sealed_by or self.keys, recipient, rumor))

    async def fetch(self, query: dict, relay: servers.Relay | None = None) -> list[nostr_sdk.Event]:  # type: ignore[type-arg]
        found = []
        async with connect((relay or self.relay).url, max_size=None) as ws:
            await ws.send(json.dumps(["REQ", "s", query]))
            async for frame in ws:
                answer = json.loads(frame)
                if answer[0] == "EOSE":
                    break
                if answer[0] == "EVENT":
                    found.append(nostr_sdk.Event.from_json(json.dumps(answer[2])))
        return found

    async def heard(self, agent: str, relay: servers.Relay | None = None) -> list[str]:
        """The texts of the direct messages ``agent`` sent this person, each rumor once, sorted (their
        created_at has a second's precision: two sent within one second have no order)."""
        rumors = {}
        for wrap in await self.fetch({"kinds": [1059], "#p": [self.hex]}, relay):
            gift = nostr_sdk.UnwrappedGift.from_gift_wrap(self.keys, wrap)
            rumor = gift.rumor()
            if gift.sender().to_hex() == agent and rumor.author().to_hex() == agent and rumor.kind().as_u16() == 14:
                rumors[rumor.id().to_hex()] = (rumor.created_at().as_secs(), rumor.content())
        return sorted(text for _, text in rumors.values())

    async def heard_n(self, agent: str, n: int, relay: servers.Relay | None = None) -> list[str]:
        async def enough() -> list[str]:
            said = await self.heard(agent, relay)
            return said if len(said) >= n else []

        return await until(enough, what=f"{n} messages from the agent")


@dataclasses.dataclass
class NostrDeployment(Deployment):
    hex: str = ""
    key: str = ""


@pytest.fixture
async def deployment(running_relay: servers.Relay, settings: config.Settings, tmp_path: Path) -> AsyncIterator[NostrDeployment]:
    key_file = tmp_path / "nostr-key"
    secret, npub = nostr.new_key()
    key_file.write_text(f"{secret}\n")
    key_file.chmod(0o600)
    served = dataclasses.replace(settings, handlers=HANDLERS, nostr_relays=(running_relay.url,), nostr_key_file=key_file)
    found = NostrDeployment(npub, served, hex=nostr_sdk.PublicKey.parse(npub).to_hex(), key=secret)
    yield found
    for gateway in reversed(found.started):
        await gateway.stop()


@pytest.fixture
def people(running_relay: servers.Relay) -> Callable[[], Person]:
    return lambda: Person(running_relay)


async def read_position(gateway: Gateway) -> dict | None:  # type: ignore[type-arg]
    async with gateway.store.read() as conn:
        from agent_gateway.store.queries import channels as queries

        stored = await queries.read_position(conn, "nostr")
    return None if stored is None else json.loads(stored)


async def reading(gateway: Gateway, relay: servers.Relay) -> None:
    """Until the channel has caught up on the relay once (its position names it)."""
    async def caught_up() -> bool:
        position = await read_position(gateway)
        return position is not None and relay.url in position["relays"]

    await until(caught_up, what="the channel reading the relay")


async def paired(deployment: NostrDeployment, gateway: Gateway, person: Person) -> str:
    """The User admitted for ``person``, who wrote once before and once after (the code, the echo)."""
    await person.say(deployment.hex, "hello?")
    await person.heard_n(deployment.hex, 1)
    async with gateway.store.transaction() as conn:
        [request] = await pairing.pending(conn)
        user_id = (await pairing.approve(conn, request.code)).user_id
    await person.say(deployment.hex, "ping")
    await person.heard_n(deployment.hex, 2)
    return user_id


async def test_the_whole_flow(deployment: NostrDeployment, people, running_relay: servers.Relay, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    gateway = await deployment.start()
    alice = people()
    await reading(gateway, running_relay)
    # The agent's DM relay list (kind 10050) names its relay.
    [relay_list] = await alice.fetch({"kinds": [10050], "authors": [deployment.hex]})
    assert [str(url).rstrip("/") for url in nostr_sdk.nip17_extract_relay_list(relay_list)] == [running_relay.url]

    # A stranger: one pairing code, nothing stored, no User admitted.
    await alice.say(deployment.hex, "hello, agent")
    [reply] = await alice.heard_n(deployment.hex, 1)
    async with gateway.store.read() as conn:
        [request] = await pairing.pending(conn)
    assert request.code in reply and request.identity == f"nostr:{alice.hex}"
    assert await count(gateway, users) == 0 and await count(gateway, messages) == 0

    # Approved: the next message is an inbound Message and the echo agent's answer arrives.
    async with gateway.store.transaction() as conn:
        user_id = (await pairing.approve(conn, request.code)).user_id
    await alice.say(deployment.hex, "ping")
    assert await alice.heard_n(deployment.hex, 2) == sorted([reply, "echo: ping"])
    assert await log_of(gateway, user_id) == [("inbound", "ping"), ("outbound", "echo: ping")]

    # An outbound Message of the agent (the Agent server's POST /messages: the SIGKILL test posts
    # it over HTTP) arrives once, exactly its text.
    await gateway.messages.send(user_id, "a word, *as written*")
    assert await alice.heard_n(deployment.hex, 3) == sorted([reply, "echo: ping", "a word, *as written*"])
    await until(lambda: all_delivered(gateway), what="every delivery delivered")
    assert len(await alice.heard(deployment.hex)) == 3

    # A rumor whose seal another key signed is not alice's: never taken. A genuine one after it
    # is answered, so the forged one was read (and dropped) before.
    mallory = people()
    await alice.say(deployment.hex, "forged", sealed_by=mallory.keys)
    await alice.say(deployment.hex, "genuine")
    assert "echo: genuine" in await alice.heard_n(deployment.hex, 4)
    assert [text for d, text in await log_of(gateway, user_id) if d == "inbound"] == ["ping", "genuine"]

    # A resend of one delivery (its outcome lost, say), even a minute later, is the same rumor
    # (dated by the delivery's UUIDv7 id) in a new gift wrap.
    written = int(time.time()) - 60
    delivery = str(uuid.UUID(int=(written * 1000) << 80 | 0x7 << 76 | 0b10 << 62 | 12345))
    for _ in range(2):
        await gateway.channels[0].network.send(alice.hex, "message", "said twice, one message", delivery)
    rumors = [
        nostr_sdk.UnwrappedGift.from_gift_wrap(alice.keys, wrap).rumor()
        for wrap in await alice.fetch({"kinds": [1059], "#p": [alice.hex]})
    ]
    resent = [rumor for rumor in rumors if rumor.content() == "said twice, one message"]
    assert len(resent) == 2 and len({rumor.id().to_hex() for rumor in resent}) == 1
    assert resent[0].created_at().as_secs() == written

    nsec = nostr_sdk.SecretKey.parse(deployment.key).to_bech32()
    for secret in (deployment.key, nsec):
        assert secret not in caplog.text
        assert all(secret not in str(record.__dict__) for record in caplog.records)


async def test_messages_written_while_the_gateway_is_stopped_are_taken_once_in_order(  # type: ignore[no-untyped-def]
    deployment: NostrDeployment, people, running_relay: servers.Relay
) -> None:
    gateway = await deployment.start()
    alice = people()
    await reading(gateway, running_relay)
    user_id = await paired(deployment, gateway, alice)
    await deployment.stop(gateway)
    now = int(time.time())
    # Written in this order (the second a second later); the relay keeps gift wraps by their
    # randomised times, so it may hand them back in either order.
    await alice.say(deployment.hex, "one", at=now + 1)
    await alice.say(deployment.hex, "two", at=now + 2)
    for _ in range(2):  # and a second restart takes neither again
        gateway = await deployment.start()
        await until(lambda: answered(gateway, user_id, 3), what="both answers")
        await reading(gateway, running_relay)
        await deployment.stop(gateway)
    gateway = await deployment.start()
    await alice.say(deployment.hex, "three")
    await until(lambda: answered(gateway, user_id, 4), what="the third answer")
    assert [text for d, text in await log_of(gateway, user_id) if d == "inbound"] == ["ping", "one", "two", "three"]
    said = await alice.heard_n(deployment.hex, 5)
    assert len(said) == 5 and {"echo: ping", "echo: one", "echo: two", "echo: three"} < set(said)


async def answered(gateway: Gateway, user_id: str, n: int) -> bool:
    return len([d for d, _ in await log_of(gateway, user_id) if d == "outbound"]) >= n


async def test_an_answer_written_while_the_relay_is_down_is_delivered_once_when_it_returns(  # type: ignore[no-untyped-def]
    deployment: NostrDeployment, people, running_relay: servers.Relay
) -> None:
    gateway = await deployment.start()
    alice = people()
    await reading(gateway, running_relay)
    user_id = await paired(deployment, gateway, alice)
    assert gateway.channels_status() == {"nostr": "ok"}
    running_relay.stop()
    await gateway.messages.send(user_id, "while you were away")
    await until(lambda: has_state(gateway, "failed"), what="a failed attempt")
    # /readyz shows it, and the process stays ready.
    assert gateway.channels_status()["nostr"].startswith("cannot reach the nostr server")
    running_relay.start()
    said = await alice.heard_n(deployment.hex, 3)
    await until(lambda: all_delivered(gateway), what="the delivery")
    assert "while you were away" in said and len(await alice.heard(deployment.hex)) == 3
    await until(lambda: _status_ok(gateway), what="the channel reconnected")


async def _status_ok(gateway: Gateway) -> bool:
    return gateway.channels_status() == {"nostr": "ok"}


async def test_open_admits_strangers_and_no_user_hears_another(deployment: NostrDeployment, people, running_relay) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start(nostr_policy="open")
    alice, bob = people(), people()
    await reading(gateway, running_relay)
    await alice.say(deployment.hex, "I am alice")
    await bob.say(deployment.hex, "I am bob")
    assert await alice.heard_n(deployment.hex, 1) == ["echo: I am alice"]
    assert await bob.heard_n(deployment.hex, 1) == ["echo: I am bob"]
    await until(lambda: all_delivered(gateway), what="both deliveries")
    assert await count(gateway, users) == 2
    assert await alice.heard(deployment.hex) == ["echo: I am alice"]
    assert await bob.heard(deployment.hex) == ["echo: I am bob"]


@pytest.fixture(scope="module")
def second_relay(relay: servers.Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Relay]:
    with servers.relay(tmp_path_factory.mktemp("second-relay")) as server:
        yield server


async def test_answers_go_to_the_relays_of_the_persons_list(  # type: ignore[no-untyped-def]
    deployment: NostrDeployment, people, running_relay: servers.Relay, second_relay: servers.Relay
) -> None:
    """The person's kind 10050 list names the second relay only: the answer is published there,
    not on the first, where the person wrote."""
    gateway = await deployment.start(nostr_relays=(running_relay.url, second_relay.url), nostr_policy="open")
    alice = people()
    await reading(gateway, second_relay)
    inbox = nostr_sdk.EventBuilder(nostr_sdk.Kind(10050), "").tags([nostr_sdk.Tag.parse(["relay", second_relay.url])])
    await alice.publish(inbox.finalize(alice.keys))
    await alice.say(deployment.hex, "where do you answer?")
    assert await alice.heard_n(deployment.hex, 1, second_relay) == ["echo: where do you answer?"]
    await until(lambda: all_delivered(gateway), what="the delivery")
    assert await alice.heard(deployment.hex) == []


async def test_allowlist_hears_only_linked_keys(deployment: NostrDeployment, people, running_relay) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start(nostr_policy="allowlist")
    alice, bob = people(), people()
    async with gateway.store.transaction() as conn:
        user_id = (await users_service.admit(conn)).id
        # Linked by npub: stored as hex.
        await identities.link(conn, user_id, f"nostr:{alice.keys.public_key().to_bech32()}")
    await reading(gateway, running_relay)
    await bob.say(deployment.hex, "hello from a stranger")
    await alice.say(deployment.hex, "ping")
    assert await alice.heard_n(deployment.hex, 1) == ["echo: ping"]
    assert await bob.heard(deployment.hex) == []
    assert await count(gateway, channel_pairings) == 0 and await count(gateway, users) == 1
    # A file message (kind 15) gets one polite reply; it is not a Message.
    recipient = nostr_sdk.PublicKey.parse(deployment.hex)
    file_rumor = (
        nostr_sdk.EventBuilder(nostr_sdk.Kind(15), "https://files.example.org/photo.jpg")
        .tags([nostr_sdk.Tag.public_key(recipient)]).finalize_unsigned(alice.keys.public_key())
    )
    await alice.publish(nostr_sdk.nip59_make_gift_wrap(alice.keys, recipient, file_rumor))
    assert sorted(await alice.heard_n(deployment.hex, 2)) == sorted(["echo: ping", inbound.ONLY_TEXT])
    assert [text for d, text in await log_of(gateway, user_id) if d == "inbound"] == ["ping"]


async def test_a_gateway_killed_between_storing_and_sending_sends_after_restart_once(  # type: ignore[no-untyped-def]
    running_relay: servers.Relay, people, database_url: str, tmp_path: Path
) -> None:
    """A real ``serve`` killed with SIGKILL while its outbound Message is stored and not yet sent
    (the relay is down, so no attempt can succeed): the next ``serve`` sends it, once. The secret
    key is in no log line and no file but its own."""
    directory = tmp_path / "deployment"
    directory.mkdir()
    secret, npub = nostr.new_key()
    agent = nostr_sdk.PublicKey.parse(npub).to_hex()
    key_file = directory / "nostr-key"
    key_file.write_text(secret)
    key_file.chmod(0o600)
    env = {
        "AGENT_GATEWAY_CHANNELS_NOSTR_RELAYS": json.dumps([running_relay.url]),
        "AGENT_GATEWAY_CHANNELS_NOSTR_KEY_FILE": str(key_file),
        "AGENT_GATEWAY_LOG_LEVEL": "DEBUG",
    }
    alice = people()
    with ServedGateway.start(directory, database_url, env) as first:
        user_id = first.cli_json("users", "add")["id"]
        assert first.cli("users", "link", user_id, f"nostr:{alice.keys.public_key().to_bech32()}").returncode == 0
        running_relay.stop()
        await store_and_kill(first, user_id)
    # The next serve starts and serves while the relay is down; /readyz says so, and stays 200.
    second = ServedGateway.spawn_on_free_ports(directory, first.env)
    try:
        async def readyz() -> dict:  # type: ignore[type-arg]
            async with httpx.AsyncClient(timeout=CEILING_S) as client:
                answer = await client.get(f"{second.ops_url}/readyz")
            assert answer.status_code == 200, answer.text
            return answer.json()

        async def unreachable() -> bool:
            return (await readyz()).get("channels", {}).get("nostr", "").startswith("cannot reach the nostr server")

        await until(unreachable, what="/readyz naming the unreachable relay")
        running_relay.start()
        assert await alice.heard_n(agent, 1) == ["stored, then killed"]

        async def delivered() -> bool:
            return [d["state"] for d in second.cli_json("channels", "deliveries")] == ["delivered"]

        await until(delivered, what="the delivery recorded as delivered")
        assert await alice.heard(agent) == ["stored, then killed"]

        async def reachable() -> bool:
            return (await readyz())["channels"] == {"nostr": "ok"}

        await until(reachable, what="/readyz with the relay back")
    finally:
        second.stop()
    nsec = nostr_sdk.SecretKey.parse(secret).to_bech32().encode()
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != key_file:
            content = path.read_bytes()
            assert secret.encode() not in content and nsec not in content, path


def test_the_key_file_is_refused_in_one_line_that_never_shows_it(tmp_path: Path) -> None:
    secret, _ = nostr.new_key()
    key_file = tmp_path / "nostr-key"
    key_file.write_text(secret)
    key_file.chmod(0o644)
    with pytest.raises(config.SettingsError) as raised:
        nostr.read_keys(key_file)
    assert str(raised.value) == f"channels.nostr.key_file: {key_file} may be read by others (mode 0644): chmod 600 it"
    key_file.chmod(0o600)
    assert nostr.read_keys(key_file).secret_key().to_hex() == secret
    key_file.write_text(nostr_sdk.SecretKey.parse(secret).to_bech32() + "\n")
    assert nostr.read_keys(key_file).secret_key().to_hex() == secret
    key_file.write_text(secret[:-2] + "zz")
    with pytest.raises(config.SettingsError) as raised:
        nostr.read_keys(key_file)
    assert str(raised.value) == (
        f"channels.nostr.key_file: {key_file} must hold the secret key alone (64 hex characters or nsec1...)"
    )
    with pytest.raises(config.SettingsError, match="no such file"):
        nostr.read_keys(tmp_path / "absent")


TABLE = """
[auth]
token_ttl_ms = 1000
[channels.nostr]
relays = ["wss://relay.example.org", "ws://127.0.0.1:7000"]
key_file = "nostr-key"
"""


def test_the_table_serves_nostr(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(TABLE)
    settings = config.load(path, environ={})
    assert settings.channels == frozenset({"nostr"})
    assert settings.nostr_relays == ("wss://relay.example.org", "ws://127.0.0.1:7000")
    assert (settings.nostr_key_file, settings.nostr_policy) == (tmp_path / "nostr-key", "pairing")
    overridden = config.load(path, environ={"AGENT_GATEWAY_CHANNELS_NOSTR_RELAYS": '["wss://other.example.org"]'})
    assert overridden.nostr_relays == ("wss://other.example.org",)


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (('key_file = "nostr-key"\n', ""),
         "channels.nostr.key_file: required to serve the Nostr channel (with relays and key_file)"),
        (('"ws://127.0.0.1:7000"', '"ws://relay.example.org"'),
         "channels.nostr.relays: each entry 'ws://relay.example.org': ws:// (unencrypted) is allowed only for a "
         "loopback host; use wss://"),
        (('"ws://127.0.0.1:7000"', '"https://relay.example.org"'),
         "channels.nostr.relays: each entry 'https://relay.example.org' must be a wss:// URL (ws:// for a relay on "
         "this host), without credentials"),
        (('"ws://127.0.0.1:7000"', '"wss://relay.example.org/"'), "channels.nostr.relays: lists a relay twice"),
        (('relays = ["wss://relay.example.org", "ws://127.0.0.1:7000"]', "relays = []"),
         "channels.nostr.relays: must list at least one relay"),
        (('key_file = "nostr-key"', 'key_file = "nostr-key"\npolicy = "all"'),
         'channels.nostr.policy: must be "pairing", "allowlist" or "open"'),
        (('key_file = "nostr-key"', 'key_file = "nostr-key"\nkey = "x"'), "channels.nostr.key: unknown setting"),
    ],
)
def test_refusals(tmp_path: Path, change: tuple[str, str], line: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(TABLE.replace(*change))
    with pytest.raises(config.SettingsError) as raised:
        config.load(path, environ={})
    assert str(raised.value) == line


def test_without_the_extra_the_channel_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nostr_sdk" else found(name, *a))
    path = tmp_path / "gateway.toml"
    path.write_text(TABLE)
    with pytest.raises(config.SettingsError) as raised:
        config.load(path, environ={})
    assert str(raised.value) == "channels.nostr: the Nostr channel needs the nostr extra: pip install 'agent-gateway[nostr]'"


def test_init_writes_the_nostr_table_and_a_new_key(tmp_path: Path) -> None:
    result = run_cli("init", str(tmp_path / "d"), "--nostr-relay", "wss://relay.example.org", config=tmp_path / "none.toml")
    assert result.returncode == 0, result.stderr
    key_file = tmp_path / "d" / "nostr-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    keys = nostr.read_keys(key_file)
    npub = keys.public_key().to_bech32()
    assert f"the agent's Nostr public key: {npub}\n" in result.stdout
    assert keys.secret_key().to_hex() not in result.stdout + result.stderr
    assert keys.secret_key().to_hex() not in (tmp_path / "d" / "gateway.toml").read_text()
    settings = config.load(tmp_path / "d" / "gateway.toml", environ={})
    assert (settings.nostr_relays, settings.nostr_key_file, settings.nostr_policy) == (
        ("wss://relay.example.org",), key_file, "pairing"
    )
    refused = run_cli("init", str(tmp_path / "e"), "--nostr-relay", "ws://relay.example.org", config=tmp_path / "none.toml")
    assert (refused.returncode, refused.stderr) == (1, (
        "agent-gateway: error: --nostr-relay: each entry 'ws://relay.example.org': ws:// (unencrypted) is allowed only "
        "for a loopback host; use wss://\n"
    ))
    assert not (tmp_path / "e").exists()


def test_init_without_the_extra_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nostr_sdk" else found(name, *a))
    refused = run_cli_here("init", str(tmp_path / "d"), "--nostr-relay", "wss://relay.example.org", config=tmp_path / "none.toml")
    assert (refused.returncode, refused.stderr) == (
        1, "agent-gateway: error: --nostr-relay needs the nostr extra: pip install 'agent-gateway[nostr]'\n"
    )
    assert not (tmp_path / "d").exists()


# --- reading and relay lists, without a relay: what a misbehaving relay could hand over -----------------

UNIT_RELAY = "ws://127.0.0.1:9"


@pytest.fixture
def channel(store: Store, settings: config.Settings, tmp_path: Path) -> nostr.Nostr:
    """The channel on ``store``, its position that of a deployment started a minute ago, never connected."""
    key_file = tmp_path / "unit-nostr-key"
    key_file.write_text(nostr.new_key()[0])
    key_file.chmod(0o600)
    made = nostr.Nostr(store, dataclasses.replace(settings, nostr_relays=(UNIT_RELAY,), nostr_key_file=key_file))
    made._state = {"from": int(time.time()) - 60, "relays": {}, "seen": {}, "ignored": {}}
    return made


def gift_wrap(author: nostr_sdk.Keys, agent: str, text: str, *, wrapped_at: int | None = None, kind: int = 14,
              written_at: int | None = None) -> dict:  # type: ignore[type-arg]
    """``author``'s NIP-17 message to ``agent`` as a relay hands it over; its gift wrap dated ``wrapped_at``
    (else randomised up to two days back, as NIP-59 has it)."""
    recipient = nostr_sdk.PublicKey.parse(agent)
    rumor = (
        nostr_sdk.EventBuilder(nostr_sdk.Kind(kind), text).tags([nostr_sdk.Tag.public_key(recipient)])
        .custom_created_at(nostr_sdk.Timestamp.from_secs(written_at or int(time.time())))
        .finalize_unsigned(author.public_key())
    )
    if wrapped_at is None:
        return json.loads(nostr_sdk.nip59_make_gift_wrap(author, recipient, rumor).as_json())
    seal = nostr_sdk.nip59_make_seal(author, recipient, rumor)
    ephemeral = nostr_sdk.Keys.generate()
    content = nostr_sdk.nip44_encrypt(ephemeral.secret_key(), recipient, seal.as_json(), nostr_sdk.Nip44Version.V2)
    wrap = (
        nostr_sdk.EventBuilder(nostr_sdk.Kind(1059), content).tags([nostr_sdk.Tag.public_key(recipient)])
        .custom_created_at(nostr_sdk.Timestamp.from_secs(wrapped_at)).finalize(ephemeral)
    )
    return json.loads(wrap.as_json())


async def inbound_texts(store: Store) -> list[str]:
    async with store.read() as conn:
        query = sa.select(messages.c.text).where(messages.c.direction == "inbound")
        return [row[0] for row in await conn.execute(query.order_by(messages.c.created_at, messages.c.seq))]


async def notices(store: Store) -> int:
    async with store.read() as conn:
        return len(await queries.newest(conn, limit=1000))


async def test_a_gift_wrap_older_than_what_is_remembered_is_refused(store: Store, channel: nostr.Nostr) -> None:
    """A wrap is remembered while a relay may send it again; once forgotten, one dated as old (a
    replay) is refused: never a second Message."""
    channel.policy = inbound.OPEN
    alice = nostr_sdk.Keys.generate()
    now = int(time.time())
    wrap = gift_wrap(alice, channel.public_key, "hello", wrapped_at=now - 86_400)
    await channel._take(UNIT_RELAY, [wrap], now)
    await channel._take(UNIT_RELAY, [wrap], now)  # within the window: remembered
    assert await inbound_texts(store) == ["hello"]
    # The relay read on, past the window: the wrap is below the floor, forgotten, and refused when sent again.
    later = now - 86_400 + nostr.WRAP_WINDOW_S + 1
    await channel._take(UNIT_RELAY, [], later)
    assert channel._state["seen"] == {}
    await channel._take(UNIT_RELAY, [wrap], later)
    assert await inbound_texts(store) == ["hello"]
    # The floor is stored with the position, so a restart refuses it too.
    assert json.loads(await inbound.read_position(store, nostr.NAME) or "{}")["floor"] == later - nostr.WRAP_WINDOW_S


async def test_the_floor_is_the_subscriptions_window(store: Store, channel: nostr.Nostr) -> None:
    """What a subscription since the position less the window is sent is taken, the edge included; a
    wrap dated before it, or ahead of now by more than the clocks' slack, is refused."""
    channel.policy = inbound.OPEN
    now = int(time.time())
    channel._state["relays"] = {UNIT_RELAY: now}
    edge, below, ahead, slack = (nostr_sdk.Keys.generate() for _ in range(4))
    await channel._take(UNIT_RELAY, [
        gift_wrap(edge, channel.public_key, "at the edge", wrapped_at=now - nostr.WRAP_WINDOW_S),
        gift_wrap(below, channel.public_key, "below it", wrapped_at=now - nostr.WRAP_WINDOW_S - 1),
        gift_wrap(ahead, channel.public_key, "from the future", wrapped_at=now + nostr.CLOCK_SLACK_S + 600),
        gift_wrap(slack, channel.public_key, "a clock a little ahead", wrapped_at=now + 60),
    ], now)
    assert sorted(await inbound_texts(store)) == ["a clock a little ahead", "at the edge"]


async def test_only_what_did_something_is_remembered_and_it_is_never_done_twice(store: Store, channel: nostr.Nostr) -> None:
    """A stranger's code, a linked person's Message: remembered, and a replay does neither again. What
    did nothing is remembered up to a bound (a stranger's words stay unread after their approval); what
    can never do anything is not remembered at all."""
    alice, stranger, flooder = nostr_sdk.Keys.generate(), nostr_sdk.Keys.generate(), nostr_sdk.Keys.generate()
    async with store.transaction() as conn:
        await identities.link(conn, (await users_service.admit(conn)).id, f"nostr:{alice.public_key().to_hex()}")
    agent = channel.public_key
    wraps = [
        gift_wrap(alice, agent, "a Message"),
        gift_wrap(stranger, agent, "hello?"),  # a pairing code
        gift_wrap(stranger, agent, "are you there?"),  # nothing: the code is pending
        gift_wrap(alice, agent, "a reaction", kind=7),  # a kind never read
        gift_wrap(alice, agent, "too old", written_at=channel._state["from"] - 1),  # before the deployment
    ]
    await channel._take(UNIT_RELAY, wraps, int(time.time()))
    assert await inbound_texts(store) == ["a Message"] and await notices(store) == 1
    assert len(channel._state["seen"]) == 2 and len(channel._state["ignored"]) == 1
    # Replayed, all of it: nothing more. Approved, the stranger's words from before stay unread.
    await channel._take(UNIT_RELAY, wraps, int(time.time()))
    async with store.transaction() as conn:
        [request] = await pairing.pending(conn)
        await pairing.approve(conn, request.code)
    await channel._take(UNIT_RELAY, wraps, int(time.time()))
    assert await inbound_texts(store) == ["a Message"] and await notices(store) == 1
    # A flood of what does nothing (a stranger past the code) is remembered up to the bound, newest kept.
    flood = [gift_wrap(flooder, agent, f"flood {n}") for n in range(4)]
    channel.policy = inbound.ALLOWLIST
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nostr, "MAX_IGNORED", 2)
        for wrap in flood:
            await channel._take(UNIT_RELAY, [wrap], int(time.time()))
    assert len(channel._state["seen"]) == 2 and len(channel._state["ignored"]) == 2
    assert await inbound_texts(store) == ["a Message"]


class HostileRelay:
    """A connected relay that answers every query with ``events``, whatever it asked for."""

    def __init__(self, channel: nostr.Nostr, events: list[nostr_sdk.Event]) -> None:
        self.channel = channel
        self.events = events

    async def send(self, frame: str) -> None:
        message = json.loads(frame)
        if message[0] == "REQ":
            for event in self.events:
                await self.channel._on_frame(UNIT_RELAY, self, json.dumps(["EVENT", message[1], json.loads(event.as_json())]))  # type: ignore[arg-type]
            await self.channel._on_frame(UNIT_RELAY, self, json.dumps(["EOSE", message[1]]))  # type: ignore[arg-type]


def relay_list(keys: nostr_sdk.Keys, url: str, *, kind: int = 10050, at: int | None = None) -> nostr_sdk.Event:
    builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(kind), "").tags([nostr_sdk.Tag.parse(["relay", url])])
    return builder.custom_created_at(nostr_sdk.Timestamp.from_secs(at or int(time.time()))).finalize(keys)


async def test_a_relay_cannot_hand_over_another_keys_relay_list(channel: nostr.Nostr) -> None:
    """Asked for alice's DM relay list, a relay answers with mallory's (signed, dated years ahead) and
    with alice's event of another kind: alice's own list is the one used."""
    alice, mallory = nostr_sdk.Keys.generate(), nostr_sdk.Keys.generate()
    ahead = int(time.time()) + 10 * 365 * 86_400
    channel._connections[UNIT_RELAY] = HostileRelay(channel, [  # type: ignore[assignment]
        relay_list(mallory, "wss://mallory.example.org", at=ahead),
        relay_list(alice, "wss://elsewhere.example.org", kind=10002, at=ahead),
        relay_list(alice, "wss://alice.example.org"),
    ])
    assert await channel._inbox(alice.public_key().to_hex()) == ("wss://alice.example.org",)
