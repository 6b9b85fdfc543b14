"""The Nostr channel: people talk to the agent in NIP-17 private direct messages.

The event cryptography is nostr-sdk's (the rust-nostr bindings): keys, Schnorr
signatures, NIP-44 v2, the NIP-59 seal and gift wrap, NIP-17's kind 14 rumor.
The relay protocol (NIP-01: ``REQ``/``EVENT``/``EOSE``/``OK``) is a plain
websocket per relay (the ``websockets`` package, already a dependency), not
nostr-sdk's ``Client``: its relay pool reconnects on its own schedule and
hides when a subscription has caught up (``EOSE``) and which relay answered
``OK``, both of which the channel's read position and its delivery rule need;
the protocol part is a few JSON arrays.

What the agent does (``docs/operate/channels.md`` says it for operators):

- At each connection to a relay it publishes its DM relay list (kind 10050:
  the configured relays), so people's clients know where to write to it.
- It subscribes on every configured relay to gift wraps (kind 1059) tagged
  ``#p`` with its public key, ``since`` two days (and an hour for clocks)
  before where that relay was read up to: a gift wrap's ``created_at`` is
  randomised up to two days into the past (NIP-59), so a message written after
  the position may carry an older time. A gift wrap is opened; only a kind 14
  rumor whose seal is signed by the rumor's author is taken (the seal's
  signature is what authenticates the sender), and a kind 15 (a file) gets the
  polite reply that only text is read. The rumor id is computed here from its
  content, never trusted from the wire.
- The read position (one row, ``channels.inbound.record``) is a JSON object:
  ``from`` (when the deployment first connected: rumors written before are
  never taken), ``relays`` (per relay, the time it was read up to), ``floor``
  (every relay's time less the window, never lowered: a gift wrap older is
  refused, since what it held is no longer remembered), ``seen`` (the rumor
  ids that made a Message or a notice, with their gift wrap's time, kept while
  at or above the floor) and ``ignored`` (likewise the ids of those that did
  nothing, at most :data:`MAX_IGNORED`). A rumor that can never do anything (a
  kind not read, or written before ``from``) is not remembered. A relay's
  backlog (up to ``EOSE``) is stored in one transaction, in the order of the
  rumors' ``created_at``, with the new position; each later message likewise.
  A message is so taken once however many relays carry it, and after restarts
  and outages.
- An outbound Message is a kind 14 rumor, sealed and gift-wrapped to the
  person, published to their DM relays (their kind 10050 list, ``wss://``
  ones and configured ones; else the configured relays). Of what a relay
  answers, only events matching the query (signed by that person, of kind
  10050) are read: a relay cannot hand over someone else's list. It is sent
  when at least one relay answers ``OK`` true; otherwise :class:`SendFailed`
  and the outbox tries again. No copy goes to the agent itself.
- A resend is the same rumor: its ``created_at`` is the delivery's time (the
  UUIDv7 delivery id's), so its content and id are the same, in a new gift
  wrap. A client that de-duplicates by rumor id (the message's identity in
  NIP-17) shows it once; one that does not may show it twice. Two equal
  texts to one person within the same second would be one rumor id.
- A relay that cannot be reached is tried again with backoff from 0.5 s,
  doubling, at most :data:`MAX_RECONNECT_S` (60 s) between tries; the
  channel is reachable while at least one relay is connected.

The secret key is read from its file when the channel starts (refused if
others may read the file) and is never logged, stored or written anywhere.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import nostr_sdk
import websockets
from websockets.asyncio.client import ClientConnection, connect

from agent_gateway.channels import inbound
from agent_gateway.channels.network import Network, SendFailed
from agent_gateway.config import Settings, SettingsError
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

NAME = "nostr"
GIFT_WRAP, SEAL_RUMOR, FILE_RUMOR, DM_RELAYS = 1059, 14, 15, 10050
# How far the clock of a person's client may be off from the gateway's.
CLOCK_SLACK_S = 3_600
# Gift wraps carry created_at up to two days in the past (NIP-59), by such clocks: how far back
# each read looks, and how long what was taken is remembered. A gift wrap older than every
# relay's position less this (the floor), or dated more than the slack ahead, is refused.
WRAP_WINDOW_S = 2 * 86_400 + CLOCK_SLACK_S
# How many ids of messages that did nothing (a stranger's, under allowlist or with a pairing
# code pending) are remembered at most: the newest. Remembered so that what someone wrote before
# they were linked is never taken when a relay sends it again; bounded because anyone can write
# to the agent, and the position is written whole with every read.
MAX_IGNORED = 1_000
SUBSCRIPTION = "dms"
# Connecting, or waiting for a relay's OK or EOSE, gives up after this long.
REQUEST_TIMEOUT_S = 20.0
FIRST_RECONNECT_S = 0.5
MAX_RECONNECT_S = 60.0
# A person's DM relay list is looked up again after this long.
INBOXES_FOR_S = 600.0
MAX_FRAME = 1 << 20


def read_keys(path: Path) -> nostr_sdk.Keys:
    """The agent's keys from ``path`` (64 hex characters or nsec1...); a SettingsError never shows the key."""
    where = "channels.nostr.key_file"
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise SettingsError(f"{where}: no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{where}: cannot read {path}: {type(exc).__name__}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise SettingsError(f"{where}: {path} may be read by others (mode {stat.S_IMODE(mode):04o}): chmod 600 it")
    try:
        return nostr_sdk.Keys.parse(text)
    except nostr_sdk.NostrSdkError:
        raise SettingsError(f"{where}: {path} must hold the secret key alone (64 hex characters or nsec1...)") from None


def new_key() -> tuple[str, str]:
    """A fresh secret key (hex, for the key file) and its public key as npub (``init --nostr-relay``)."""
    keys = nostr_sdk.Keys.generate()
    return keys.secret_key().to_hex(), keys.public_key().to_bech32()


def sent_at(transaction_id: str) -> int:
    """The Unix time of a delivery, from its UUIDv7 id (``ids.new``); now for another id."""
    try:
        parsed = uuid.UUID(transaction_id)
    except ValueError:
        return int(time.time())
    return (parsed.int >> 80) // 1000 if parsed.version == 7 else int(time.time())


class Nostr(Network):
    """The agent's Nostr key on its relays, connected while this process leads the channel."""

    name = NAME

    def __init__(self, store: Store, settings: Settings) -> None:
        super().__init__()
        assert settings.nostr_relays and settings.nostr_key_file
        self.store = store
        self.relays = tuple(url.rstrip("/") for url in settings.nostr_relays)
        self.policy = settings.nostr_policy
        self._keys = read_keys(settings.nostr_key_file)
        self.public_key = self._keys.public_key().to_hex()
        self._state: dict[str, Any] = {}
        self._connections: dict[str, ClientConnection] = {}
        self._problems: dict[str, str] = {}
        # (relay, event id) → the future its OK answers; (relay, subscription) → a fetch's events, and its end.
        self._acks: dict[tuple[str, str], asyncio.Future[tuple[bool, str]]] = {}
        self._fetches: dict[tuple[str, str], tuple[list[Any], asyncio.Future[None]]] = {}
        self._inboxes: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._queries = itertools.count()
        # One read's records at a time: each starts from the position the one before stored.
        self._recording = asyncio.Lock()

    def __repr__(self) -> str:  # never the key
        return f"Nostr({self.public_key} on {', '.join(self.relays)})"

    # --- reading ------------------------------------------------------------------------------

    async def read(self) -> None:
        stored = await inbound.read_position(self.store, NAME)
        if stored is None:  # a new deployment: rumors written before now are never taken
            self._state = {"from": int(time.time()), "relays": {}, "seen": {}, "ignored": {}}
            await inbound.start_position(self.store, NAME, json.dumps(self._state))
        else:
            self._state = json.loads(stored)
        async with asyncio.TaskGroup() as group:
            for url in self.relays:
                group.create_task(self._read_relay(url), name=f"nostr relay {url}")

    async def _read_relay(self, url: str) -> None:
        wait = FIRST_RECONNECT_S
        while True:
            try:
                async with connect(url, open_timeout=REQUEST_TIMEOUT_S, max_size=MAX_FRAME) as ws:
                    self._connections[url] = ws
                    await self._publish_relay_list(ws)
                    await self._subscribe(url, ws)
                    wait = FIRST_RECONNECT_S
                    async for frame in ws:
                        await self._on_frame(url, ws, frame)
                raise ConnectionError("the relay closed the connection")
            except (OSError, TimeoutError, websockets.WebSocketException, ValueError) as exc:
                self._lost(url, type(exc).__name__)
            except Exception as exc:  # storing failed (the database went away): read again from the position
                self._lost(url, type(exc).__name__)
                logger.error("nostr: cannot store what %s sent: %s", url, type(exc).__name__,
                             extra={"action": "channel_read_error"})
            logger.warning("nostr: %s: %s; reading again in %.1fs", url, self._problems.get(url), wait,
                           extra={"action": "channel_read_error"})
            await asyncio.sleep(wait)
            wait = min(wait * 2, MAX_RECONNECT_S)

    def _lost(self, url: str, problem: str) -> None:
        self._connections.pop(url, None)
        waiting = [future for (relay, _), future in self._acks.items() if relay == url]
        waiting += [ended for (relay, _), (_, ended) in self._fetches.items() if relay == url]
        for future in waiting:
            if not future.done():
                future.set_exception(ConnectionError(problem))
        self._problems[url] = problem
        self._update_reachable()

    def _update_reachable(self) -> None:
        self.reachable = bool(self._connections)
        self.problem = None if self.reachable else "; ".join(f"{url}: {why}" for url, why in self._problems.items())

    async def _publish_relay_list(self, ws: ClientConnection) -> None:
        tags = [nostr_sdk.Tag.parse(["relay", url]) for url in self.relays]
        event = nostr_sdk.EventBuilder(nostr_sdk.Kind(DM_RELAYS), "").tags(tags).finalize(self._keys)
        await ws.send(json.dumps(["EVENT", json.loads(event.as_json())]))

    async def _subscribe(self, url: str, ws: ClientConnection) -> None:
        """Ask for the gift wraps since this relay's position; take its backlog up to EOSE in one read."""
        asked_at = int(time.time())
        since = max(self._read_up_to(url) - WRAP_WINDOW_S, self._floor())
        await ws.send(json.dumps(["REQ", SUBSCRIPTION, {"kinds": [GIFT_WRAP], "#p": [self.public_key], "since": since}]))
        backlog: list[dict[str, Any]] = []
        async with asyncio.timeout(REQUEST_TIMEOUT_S) as deadline:
            async for frame in ws:
                message = json.loads(frame)
                if message[:2] == ["EOSE", SUBSCRIPTION]:
                    break
                if message[:2] == ["EVENT", SUBSCRIPTION]:
                    backlog.append(message[2])
                    deadline.reschedule(asyncio.get_running_loop().time() + REQUEST_TIMEOUT_S)
                elif message[:2] == ["CLOSED", SUBSCRIPTION]:
                    raise ConnectionError(f"the relay refused the subscription: {str(message[2:3])[:200]}")
                else:
                    await self._on_frame(url, ws, frame)
        await self._take(url, backlog, asked_at)
        self._problems.pop(url, None)
        self._update_reachable()

    def _read_up_to(self, url: str) -> int:
        """Where ``url`` was read up to; a relay never read starts where the others are."""
        relays: dict[str, int] = self._state["relays"]
        if url in relays:
            return relays[url]
        known = [relays[relay] for relay in self.relays if relay in relays]
        return min(known) if known else int(self._state["from"])

    def _floor(self) -> int:
        """The gift wrap time below which nothing is remembered, so nothing is taken: stored, else
        (a position written before it was) where every relay was read up to, less the window."""
        if "floor" in self._state:
            return int(self._state["floor"])
        relays: dict[str, int] = self._state["relays"]
        known = [relays[relay] for relay in self.relays if relay in relays]
        return (min(known) if known else int(self._state["from"])) - WRAP_WINDOW_S

    async def _on_frame(self, url: str, ws: ClientConnection, frame: str | bytes) -> None:
        message = json.loads(frame)
        if not isinstance(message, list) or not message:
            return
        if message[:2] == ["EVENT", SUBSCRIPTION] and len(message) > 2:
            await self._take(url, [message[2]], int(time.time()))
        elif message[0] == "OK" and len(message) > 2:
            future = self._acks.get((url, str(message[1])))
            if future is not None and not future.done():
                future.set_result((message[2] is True, str(message[3]) if len(message) > 3 else ""))
        elif message[0] in ("EVENT", "EOSE", "CLOSED") and len(message) > 1:
            fetch = self._fetches.get((url, str(message[1])))
            if fetch is not None and message[0] == "EVENT" and len(message) > 2:
                fetch[0].append(message[2])
            elif fetch is not None and not fetch[1].done():
                fetch[1].set_result(None)

    async def _take(self, url: str, wraps: list[Any], read_up_to: int) -> None:
        """Store what ``wraps`` hold that was never taken, in order, with the new position."""
        async with self._recording:
            state = self._state
            floor = self._floor()
            latest = int(time.time()) + CLOCK_SLACK_S
            seen: dict[str, int] = dict(state["seen"])
            ignored: dict[str, int] = dict(state.get("ignored", {}))
            # This read's new rumors: their gift wrap's time, and what the machinery takes.
            wrapped: dict[str, int] = {}
            opened: list[tuple[int, str, inbound.Received]] = []
            for wrap in wraps:
                found = self._open(wrap, floor, latest)
                if found is None:
                    continue
                rumor_id, created_at, wrap_created_at, received = found
                known = next((where for where in (seen, ignored, wrapped) if rumor_id in where), None)
                if known is not None:
                    # Another gift wrap of it (one per relay, say): remembered while the later can come.
                    known[rumor_id] = max(known[rumor_id], wrap_created_at)
                elif created_at >= state["from"] and received is not None:
                    wrapped[rumor_id] = wrap_created_at
                    opened.append((created_at, rumor_id, received))
            relays = {relay: at for relay, at in state["relays"].items() if relay in self.relays}
            relays[url] = max(relays.get(url, 0), read_up_to)
            # A gift wrap older than every relay's position less the window is never sent again
            # by a relay asked for what it has since then; an older one is refused (above).
            new_floor = max(floor, min(relays.values()) - WRAP_WINDOW_S)
            opened.sort(key=lambda item: item[:2])
            new_state: dict[str, Any] = {}

            def position(outcomes: list[str]) -> str:
                """The new position, remembering each rumor by what it did (called in the transaction)."""
                did, did_nothing = dict(seen), dict(ignored)
                for (_, rumor_id, _), outcome in zip(opened, outcomes, strict=True):
                    (did_nothing if outcome == inbound.IGNORED else did)[rumor_id] = wrapped[rumor_id]
                newest = [(rumor_id, at) for rumor_id, at in did_nothing.items() if at >= new_floor][-MAX_IGNORED:]
                new_state.clear()
                new_state.update({
                    "from": state["from"], "relays": relays, "floor": new_floor,
                    "seen": {rumor_id: at for rumor_id, at in did.items() if at >= new_floor}, "ignored": dict(newest),
                })
                return json.dumps(new_state)

            await inbound.record(self.store, NAME, self.policy, [received for _, _, received in opened], position)
            self._state = new_state

    def _open(self, wrap: Any, floor: int, latest: int) -> tuple[str, int, int, inbound.Received | None] | None:
        """A gift wrap's rumor: its id, its created_at, the wrap's, and what the machinery takes
        (None for a kind it ignores); None for a wrap that is not a valid one for the agent, or is
        dated before ``floor`` (what it held may have been taken and forgotten: a replay) or after
        ``latest`` (dated ahead, it would be remembered for as long)."""
        try:
            event = nostr_sdk.Event.from_json(json.dumps(wrap))
            if event.kind().as_u16() != GIFT_WRAP or not event.verify():
                return None
            if not floor <= event.created_at().as_secs() <= latest:  # before the cost of opening it
                logger.debug("nostr: a gift wrap dated outside the window", extra={"action": "channel_read_ignored"})
                return None
            gift = nostr_sdk.UnwrappedGift.from_gift_wrap(self._keys, event)
            rumor = gift.rumor()
            author = rumor.author().to_hex()
            if gift.sender().to_hex() != author or author == self.public_key:
                return None  # not signed by its author; or the agent's own: never a loop
            # The id the rumor's content gives (the one on the wire is the sender's word).
            unsigned = json.loads(rumor.as_json())
            unsigned.pop("id", None)
            rumor_id = nostr_sdk.UnsignedEvent.from_json(json.dumps(unsigned)).ensure_id().id()
        except (nostr_sdk.NostrSdkError, ValueError, TypeError, AttributeError):
            logger.debug("nostr: an event that is no gift wrap for the agent", extra={"action": "channel_read_ignored"})
            return None
        assert rumor_id is not None
        kind = rumor.kind().as_u16()
        received = None
        if kind == SEAL_RUMOR:
            received = inbound.Received(author, author, inbound.TEXT, rumor.content())
        elif kind == FILE_RUMOR:
            received = inbound.Received(author, author, inbound.UNREADABLE)
        return rumor_id.to_hex(), rumor.created_at().as_secs(), event.created_at().as_secs(), received

    # --- sending ------------------------------------------------------------------------------

    async def open_conversation(self, address: str) -> str:
        # A direct message needs no conversation made first: it is the person's key.
        return address

    async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
        try:
            recipient = nostr_sdk.PublicKey.parse(conversation)
        except nostr_sdk.NostrSdkError:
            raise SendFailed("the conversation is not a Nostr public key") from None
        rumor = (
            nostr_sdk.EventBuilder(nostr_sdk.Kind(SEAL_RUMOR), text)
            .tags([nostr_sdk.Tag.public_key(recipient)])
            .custom_created_at(nostr_sdk.Timestamp.from_secs(sent_at(transaction_id)))
            .finalize_unsigned(self._keys.public_key())
        )
        wrap = nostr_sdk.nip59_make_gift_wrap(self._keys, recipient, rumor)
        event = json.loads(wrap.as_json())
        targets = await self._inbox(conversation)
        outcomes = await asyncio.gather(*(self._publish(url, event) for url in targets))
        if not any(ok for ok, _ in outcomes):
            said = "; ".join(f"{url}: {why}" for url, (_, why) in zip(targets, outcomes, strict=True))
            raise SendFailed(f"no relay took the message ({said})")

    async def _inbox(self, person: str) -> tuple[str, ...]:
        """The relays to write to ``person`` on: their kind 10050 list (its wss:// and configured
        relays: a stranger's list never makes the gateway connect to a host of its network), else
        the configured relays."""
        now = time.monotonic()
        cached = self._inboxes.get(person)
        if cached is not None and now - cached[0] < INBOXES_FOR_S:
            return cached[1]
        newest: nostr_sdk.Event | None = None
        asked = list(self._connections)
        for url in asked:
            # Only the person's own list (_fetch keeps what matches): a hostile relay's answer of
            # another key's list, dated ahead, would otherwise send their answers elsewhere.
            for found in await self._fetch(url, {"kinds": [DM_RELAYS], "authors": [person], "limit": 1}):
                if newest is None or found.created_at().as_secs() > newest.created_at().as_secs():
                    newest = found
        listed = [] if newest is None else [str(url).rstrip("/") for url in nostr_sdk.nip17_extract_relay_list(newest)]
        usable = tuple(dict.fromkeys(url for url in listed if url.startswith("wss://") or url in self.relays))
        inbox = usable or self.relays
        if asked:  # with no relay connected, nothing was learnt: asked again next time
            self._inboxes[person] = (now, inbox)
        return inbox

    async def _fetch(self, url: str, query: dict[str, Any]) -> list[nostr_sdk.Event]:
        """The valid events ``query`` finds on the connected relay ``url`` (none if it does not
        answer): validly signed, and matching ``query`` (a relay's answer is its word only)."""
        wanted = nostr_sdk.Filter.from_json(json.dumps(query))
        ws = self._connections.get(url)
        if ws is None:
            return []
        name = f"q{next(self._queries)}"
        found: list[Any] = []
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fetches[(url, name)] = (found, ended)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await ws.send(json.dumps(["REQ", name, query]))
                await ended
                await ws.send(json.dumps(["CLOSE", name]))
        except (TimeoutError, ConnectionError, websockets.WebSocketException):
            return []
        finally:
            self._fetches.pop((url, name), None)
        events = []
        for raw in found:
            try:
                event = nostr_sdk.Event.from_json(json.dumps(raw))
            except nostr_sdk.NostrSdkError:
                continue
            if wanted.match_event(event) and event.verify():
                events.append(event)
        return events

    async def _publish(self, url: str, event: dict[str, Any]) -> tuple[bool, str]:
        """Publish ``event`` on ``url`` (the reading connection, or one of its own); whether the
        relay answered OK true, and why not."""
        ws = self._connections.get(url)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if ws is not None:
                    future: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
                    self._acks[(url, event["id"])] = future
                    try:
                        await ws.send(json.dumps(["EVENT", event]))
                        return await future
                    finally:
                        self._acks.pop((url, event["id"]), None)
                async with connect(url, open_timeout=REQUEST_TIMEOUT_S, max_size=MAX_FRAME) as own:
                    await own.send(json.dumps(["EVENT", event]))
                    async for frame in own:
                        message = json.loads(frame)
                        if isinstance(message, list) and message[:2] == ["OK", event["id"]] and len(message) > 2:
                            return message[2] is True, str(message[3]) if len(message) > 3 else ""
                    return False, "the relay closed the connection"
        except TimeoutError:
            return False, f"no answer within {REQUEST_TIMEOUT_S:g}s"
        except (OSError, ConnectionError, websockets.WebSocketException, ValueError) as exc:
            return False, type(exc).__name__

    async def close(self) -> None:
        for ws in list(self._connections.values()):
            await ws.close()
        self._connections.clear()
