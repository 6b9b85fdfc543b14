"""The Matrix channel, on matrix-nio: people talk to the agent from any Matrix client.

Why matrix-nio rather than mautrix-python: it is a client library first (mautrix
is a framework for bridges and bots, with its own state store and database
layer to set up), its ``AsyncClient`` has the sync loop (``sync_forever``, with
response callbacks we store each sync from) and every call this channel makes
(join, create a direct room, ``room_send`` with an explicit transaction id),
its responses are typed, and it installs from PyPI with pure-Python
dependencies. End-to-end encryption in both needs python-olm, whose libolm is
deprecated and unmaintained: no maintained crypto backend installs from the
registries, so the agent reads no encrypted room, and says so once in each.

What the agent does (``docs/operate/channels.md`` says it for operators):

- It joins every room it is invited to, whatever the policy (the policy
  decides what it hears, not what it joins).
- A room is direct when it has at most two members (the agent and one person,
  joined or invited; before its members are known, when its invite said
  ``is_direct``), counted as each message was written: one written before
  someone left in the same sync counts them. In a direct room every message is
  heard; in a larger room only those that mention the agent (its user ID in
  the text, or ``m.mentions``). A heard message is an inbound Message of its sender's User. The answer to a
  message in a room of more than two members goes back there; everything else
  the agent writes a User goes to their direct room (``channels.outbox``), and
  a direct room that gains a third member is no longer one.
- Text (``m.text``, ``m.emote``) is read; an image, file, audio or video in a
  direct room gets one polite reply saying only text is read; other events are
  ignored, and the agent's own messages are never taken as input.
- A new deployment starts reading from its first connection: the first sync
  only sets the position (and accepts pending invites); history is never taken,
  nor a room's history from before the agent joined it.
- Each sync's messages are stored with its ``next_batch`` token in one
  transaction (``channels.inbound.record``); a failure to store leaves the
  token where it was, and the sync is read again from there.
- An outbound Message is one ``m.text`` whose ``body`` is exactly its text,
  sent with ``PUT /rooms/{roomId}/send/m.room.message/{txnId}``, the txnId
  being the channel delivery's id: a resend after a lost answer is the same
  event. The channel's own words go as ``m.notice``.

The access token is read from its file when the channel starts, used as given
(no password login), and never logged, stored in the database or written
anywhere: errors are reported by their type and the homeserver's error code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nio

from agent_gateway.channels import inbound
from agent_gateway.channels.network import Network, SendFailed
from agent_gateway.config import Settings, SettingsError
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries

logger = logging.getLogger(__name__)

NAME = "matrix"
# The long poll of each sync; the homeserver answers at once when something happens.
SYNC_TIMEOUT_MS = 30_000
# A request that gets no answer fails after this long; nio then tries again this many times.
REQUEST_TIMEOUT_S = 60.0
MAX_TIMEOUTS = 2
# The waits between reconnections while the homeserver is unreachable.
FIRST_RECONNECT_S = 0.5
MAX_RECONNECT_S = 30.0
# How many of a room's newest events one sync may bring: what a restart takes of one room's
# messages written while the gateway was down (past it, the sync is "limited" and says so).
TIMELINE_LIMIT = 500
# What each sync asks for: the timeline's messages, memberships (the agent's own join ends a
# room's history) and encrypted events, and the rooms' state; no presence, account data,
# typing or receipts, which the channel never reads: a person's client sends a typing
# notification and a read receipt around each message, and each would otherwise end the
# agent's long poll with a sync the gateway stores a new position from. Members are not
# lazy-loaded: a room's member count says whether it is direct, and a sync after a restart
# would not carry it. Sent inline: uploading it once (a filter id) measured no cheaper.
_NOTHING = {"not_types": ["*"]}
SYNC_FILTER = {
    "presence": _NOTHING,
    "account_data": _NOTHING,
    "room": {
        "timeline": {"limit": TIMELINE_LIMIT, "types": ["m.room.message", "m.room.member", "m.room.encrypted"]},
        "ephemeral": _NOTHING,
        "account_data": _NOTHING,
    },
}
CANNOT_DECRYPT = (
    "I cannot read encrypted messages. To talk to me, start a new direct chat with me "
    "with encryption turned off."
)
_TEXT_EVENTS = (nio.RoomMessageText, nio.RoomMessageEmote)
_MEDIA_EVENTS = (nio.RoomMessageMedia, nio.RoomEncryptedMedia)


def read_token(path: Path) -> str:
    """The access token in ``path`` (surrounding whitespace stripped); a SettingsError never shows it."""
    where = "channels.matrix.access_token_file"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise SettingsError(f"{where}: no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{where}: cannot read {path}: {type(exc).__name__}") from None
    if not token or any(c.isspace() for c in token):
        raise SettingsError(f"{where}: {path} must hold the access token alone")
    return token


def _shared(members: int | None) -> bool:
    """Whether others than one person read a room of ``members`` (None: not known): more than two
    members (the agent and them), whatever its invite said (a direct room others were invited to
    later is read by them)."""
    return members is None or members > 2


# The memberships that count a room's member (nio's member_count counts the invited too).
_MEMBERS = frozenset({"join", "invite"})


def _members(room: nio.MatrixRoom | None) -> int | None:
    """``room``'s members (joined and invited) once a sync is applied; None: not known."""
    return None if room is None else room.member_count


def _members_at(room: nio.MatrixRoom | None, events: Sequence[Any]) -> list[int | None]:
    """The room's members as each of a sync's timeline ``events`` was written: its count once the
    sync is applied, less what the timeline's membership changes after that event did. So a
    message written before someone left in the same sync counts them, and one written before an
    invite does not."""
    members = _members(room)
    found: list[int | None] = [None] * len(events)
    for index in range(len(events) - 1, -1, -1):
        found[index] = members
        event = events[index]
        if members is not None and isinstance(event, nio.RoomMemberEvent):
            members -= (event.membership in _MEMBERS) - (event.prev_membership in _MEMBERS)
    return found


class Matrix(Network):
    """The agent's Matrix account, connected while this process leads the channel."""

    name = NAME

    def __init__(self, store: Store, settings: Settings) -> None:
        super().__init__()
        assert settings.matrix_homeserver and settings.matrix_user_id and settings.matrix_access_token_file
        self.store = store
        self.homeserver = settings.matrix_homeserver
        self.user_id = settings.matrix_user_id
        self.policy = settings.matrix_policy
        self._token = read_token(settings.matrix_access_token_file)
        self._client: nio.AsyncClient | None = None
        # Rooms whose invite said is_direct: direct while their members are not known yet.
        self._direct: set[str] = set()
        # Rooms told the agent cannot read encryption: read from the outbox once per room and process
        # (inbound.take), so that a flood of encrypted events costs one query per room; each added
        # once the sync that told it is stored.
        self._told: set[str] = set()
        self._catching_up = False

    def __repr__(self) -> str:  # never the token
        return f"Matrix({self.user_id} on {self.homeserver})"

    def _new_client(self) -> nio.AsyncClient:
        config = nio.AsyncClientConfig(
            max_timeouts=MAX_TIMEOUTS, request_timeout=REQUEST_TIMEOUT_S, store_sync_tokens=False, encryption_enabled=False,
        )
        client = nio.AsyncClient(self.homeserver, self.user_id, config=config)
        client.restore_login(self.user_id, "", self._token)
        client.add_response_callback(self._on_sync, nio.SyncResponse)
        client.add_response_callback(self._on_sync_error, nio.SyncError)
        return client

    async def read(self) -> None:
        wait = FIRST_RECONNECT_S
        while True:
            client = self._client = self._client or self._new_client()
            try:
                position = await inbound.read_position(self.store, NAME)
                # No position: a new deployment, whose first sync only says where reading starts.
                self._catching_up = position is None
                client.next_batch = position
                await client.sync_forever(
                    timeout=SYNC_TIMEOUT_MS, sync_filter=SYNC_FILTER, since=position, full_state=True
                )
            except Exception as exc:
                self._unreachable(exc)
                logger.warning(
                    "matrix: %s; reading again in %.1fs", self.problem, wait, extra={"action": "channel_read_error"}
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, MAX_RECONNECT_S)
                continue
            # sync_forever ends quietly when it is cancelled: the cancel was meant for this task.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError()
            wait = FIRST_RECONNECT_S

    def _unreachable(self, exc: BaseException) -> None:
        self.reachable = False
        self.problem = type(exc).__name__

    async def _on_sync_error(self, response: nio.SyncError) -> None:
        # An answer, but a refusal (an unknown token, say): waited on before the next sync.
        self.reachable = False
        self.problem = f"the homeserver refused to sync: {response.status_code or ''} {response.message or ''}".strip()
        logger.warning("matrix: %s", self.problem, extra={"action": "channel_read_error"})
        await asyncio.sleep(MAX_RECONNECT_S / 6)

    async def _on_sync(self, response: nio.SyncResponse) -> None:
        """Store one sync: join the rooms invited to, take the messages, advance the position."""
        self.reachable, self.problem = True, None
        client = self._client
        assert client is not None
        for room_id, invited in response.rooms.invite.items():
            await self._join(client, room_id, invited)
        read: list[inbound.Received] = []
        # Rooms this sync tells the agent cannot read encryption: remembered once it is stored.
        telling: set[str] = set()
        if not self._catching_up:
            for room_id, joined in response.rooms.join.items():
                members = _members_at(client.rooms.get(room_id), joined.timeline.events)
                events = self._since_joined(joined.timeline.events)
                if joined.timeline.limited and len(events) == len(joined.timeline.events):
                    # A gap in a room joined before (a newly joined one's gap is its history).
                    logger.warning(
                        "matrix: more than %d events in one room since the last sync; the older ones are not read",
                        TIMELINE_LIMIT, extra={"action": "channel_read_limited"},
                    )
                for event, at in zip(events, members[len(members) - len(events):], strict=True):
                    received = self._received(room_id, at, event, telling)
                    if received is not None:
                        read.append(received)
        self._catching_up = False
        # A room this sync shows with more than two members is no User's private room any more
        # (a direct room someone was invited to): their next private Message opens another.
        shared = [room_id for room_id in response.rooms.join if _shared(_members(client.rooms.get(room_id)))]
        await inbound.record(self.store, NAME, self.policy, read, response.next_batch, shared=shared)
        # Only now: a sync that failed to store is read again, and must tell these rooms again.
        self._told |= telling

    def _since_joined(self, events: list[Any]) -> list[Any]:
        """The events after the agent's own join, when this sync holds it: a room's history from
        before the agent joined (which the room may show it) is never taken."""
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if (
                isinstance(event, nio.RoomMemberEvent) and event.state_key == self.user_id
                and event.membership == "join" and event.prev_membership != "join"  # not a profile change
            ):
                return events[index + 1:]
        return events

    async def _join(self, client: nio.AsyncClient, room_id: str, invited: Any) -> None:
        for event in getattr(invited, "invite_state", ()):
            if isinstance(event, nio.InviteMemberEvent) and event.state_key == self.user_id:
                if (event.content or {}).get("is_direct"):
                    self._direct.add(room_id)
        answer = await client.join(room_id)
        if isinstance(answer, nio.JoinError):
            logger.warning(
                "matrix: cannot join a room it was invited to: %s", answer.status_code, extra={"action": "channel_join"}
            )
        else:
            logger.info("matrix: joined a room it was invited to", extra={"action": "channel_join"})

    def _is_direct(self, room_id: str, members: int | None) -> bool:
        # By its members once known: in a direct room others were invited to, the people talking
        # among themselves are not talking to the agent. Its invite says so only until then.
        return not _shared(members) if members is not None else room_id in self._direct

    def _mentioned(self, event: nio.Event) -> bool:
        content = event.source.get("content", {}) if isinstance(event.source, dict) else {}
        mentions = content.get("m.mentions") or {}
        if isinstance(mentions, dict) and self.user_id in (mentions.get("user_ids") or ()):
            return True
        return any(self.user_id in str(content.get(key) or "") for key in ("body", "formatted_body"))

    def _received(
        self, room_id: str, members: int | None, event: nio.Event, telling: set[str]
    ) -> inbound.Received | None:
        """What the machinery takes from one timeline event, written in a room of ``members``
        (None: not known); None for what is ignored. A room told it cannot read encryption by
        this sync is added to ``telling``."""
        if event.sender == self.user_id:
            return None  # never a loop: the agent's own messages are not input
        direct = self._is_direct(room_id, members)
        if isinstance(event, _TEXT_EVENTS):
            if not direct and not self._mentioned(event):
                return None
            return inbound.Received(event.sender, room_id, inbound.TEXT, event.body, shared=_shared(members))
        if isinstance(event, _MEDIA_EVENTS) and direct:
            return inbound.Received(event.sender, room_id, inbound.UNREADABLE)
        if isinstance(event, nio.MegolmEvent) and room_id not in self._told and room_id not in telling:
            telling.add(room_id)
            return inbound.Received(event.sender, room_id, inbound.UNREADABLE, CANNOT_DECRYPT, once=True)
        return None

    async def open_conversation(self, address: str) -> str:
        client = self._client
        if client is None:
            raise SendFailed("the channel is not connected")
        try:
            answer = await client.room_create(
                is_direct=True, invite=[address], preset=nio.RoomPreset.trusted_private_chat
            )
        except Exception as exc:
            self._unreachable(exc)
            raise SendFailed(f"cannot reach the homeserver ({type(exc).__name__})") from None
        if isinstance(answer, nio.RoomCreateError):
            raise SendFailed(f"the homeserver refused to create the room: {answer.status_code}")
        self._direct.add(answer.room_id)
        return answer.room_id

    async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
        client = self._client
        if client is None:
            raise SendFailed("the channel is not connected")
        content = {"msgtype": "m.notice" if kind == queries.NOTICE else "m.text", "body": text}
        try:
            answer = await client.room_send(conversation, "m.room.message", content, tx_id=transaction_id)
        except Exception as exc:
            self._unreachable(exc)
            raise SendFailed(f"cannot reach the homeserver ({type(exc).__name__})") from None
        if isinstance(answer, nio.RoomSendError):
            raise SendFailed(f"the homeserver refused the message: {answer.status_code}")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
