"""The Nostr HTTP authentication scheme, NIP-98 (issue 37).

``Authorization: Nostr <base64 of a signed kind 27235 event>`` authenticates a
request as the User linked to the identity ``nostr:<the event's pubkey>``
when the event's id is the SHA-256 of its NIP-01 serialisation and its BIP-340 Schnorr
signature verifies (libsecp256k1 through coincurve, the ``agent-gateway[nostr]`` extra: no
cryptography here), its ``u`` tag is the
request's absolute URL as sent (:func:`signed_url`), its ``method`` tag the request's method, its
``created_at`` within :data:`WINDOW` of now either way, its ``payload`` tag
the SHA-256 hex digest of a body's bytes, and its id was not accepted before
(a table, so across every process of the deployment; one statement per batch of requests).
Anything else, a malformed header included, is the spec's one 401 (the scheme answers None); a request
without a ``Nostr`` header is not this scheme's, so the next one is asked.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import time
from collections.abc import Sequence

import orjson
from coincurve import PublicKeyXOnly
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.datastructures import URL
from starlette.requests import Request
from starlette.types import Scope

from agent_gateway.auth.schemes import Authenticated
from agent_gateway.http import fastpath
from agent_gateway.store.batch import Batcher
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import nostr as queries

KIND = 27235
# How far created_at may be from now, either way (NIP-98 suggests 60 s); an event older than this
# is refused on its created_at alone, so its id need not be remembered longer.
WINDOW = 60
# How long after its created_at an accepted id is remembered: WINDOW, and as much again for the
# clocks of the deployment's processes, any of which may forget it (purge) while another accepts.
REMEMBERED = 2 * WINDOW
# Accepted ids remembered per statement at most.
SPEND_BATCH = 64
# Expired ids are forgotten at most this often (seconds) by each process: a statement of its own,
# whose cost is then shared by every id remembered meanwhile.
PURGE_INTERVAL = 1


@dataclasses.dataclass(frozen=True)
class Claim:
    """What a request says it is, as the signed event must name it."""

    url: str
    method: str
    body: bytes


def signed_url(scope: Scope, public_base_url: str | None = None) -> str:
    """The absolute URL a request was sent to, which its event's ``u`` tag must equal exactly.

    The path and query are the request target's bytes as they came (``raw_path``: ``scope["path"]``
    is percent-decoded, so a client signing ``/ledger/entries/%31`` would be refused), read as UTF-8
    (a target is ASCII; raw UTF-8 in a query matches the same text signed, and a byte that is not
    UTF-8 becomes a lone surrogate, which no event's JSON can hold: refused, never an error). The
    scheme, host and port are Starlette's (the Host header as sent), or ``public_base_url``'s, which
    then stands before the path as the proxy forwarded it. The fast path's handlers and the routes
    both authenticate through :class:`NostrScheme`, so both compare with this one URL.
    """
    raw_path = scope.get("raw_path")
    target = scope["path"] if raw_path is None else raw_path.decode("utf-8", "surrogateescape")
    query = scope.get("query_string", b"")
    if query:
        target += "?" + query.decode("utf-8", "surrogateescape")
    if public_base_url is not None:
        return public_base_url + target
    # Only what names the origin: Starlette's URL of the whole scope decodes the query strictly.
    origin = URL(scope={"scheme": scope.get("scheme", "http"), "server": scope.get("server"),
                        "headers": scope["headers"], "path": ""})
    return str(origin) + target


def verified_pubkey(credentials: str, claim: Claim, *, now: int) -> tuple[str, str, int] | None:
    """``(pubkey hex, event id hex, created_at)`` of a valid NIP-98 event for ``claim``, or None.

    Pure: the replay check is the caller's, on the id returned.
    """
    try:
        text = base64.b64decode(credentials, validate=True)
        fields = orjson.loads(text)
    except ValueError:
        # binascii.Error, orjson.JSONDecodeError (nesting, NUL, NaN, invalid UTF-8 or surrogates) and
        # the plain ValueError of a credential with a character past ASCII (Starlette reads header
        # bytes as latin-1) are all ValueErrors: each is the one 401, never a 500.
        return None
    # What the event must say is read off the JSON first, so that a wrong event costs no
    # verification. The signature then covers
    # exactly these fields: the id it signs is their hash, recomputed below.
    # An int exactly: 27235.0 equals KIND, but is not the kind NIP-01 serialises (nor is an integer past
    # 64 bits, which orjson reads as a float).
    if not isinstance(fields, dict) or type(fields.get("kind")) is not int or fields["kind"] != KIND:
        return None
    created_at, listed = fields.get("created_at"), fields.get("tags")
    if type(created_at) is not int or abs(created_at - now) > WINDOW or not isinstance(listed, list):
        return None
    tags: dict[str, list] = {}
    for values in listed:
        # A tag is a name and its values, all strings (nostr-sdk refuses an empty tag too).
        if not isinstance(values, list) or not values or not all(type(value) is str for value in values):
            return None
        # The first tag of a name counts: a second "u" or "method" cannot widen what was signed.
        tags.setdefault(values[0], values[1:])
    if tags.get("u") != [claim.url] or tags.get("method") != [claim.method]:
        return None
    if claim.body and tags.get("payload") != [hashlib.sha256(claim.body).hexdigest()]:
        return None
    content = fields.get("content")
    if type(content) is not str:
        return None
    try:
        pubkey = _key(binascii.unhexlify(fields["pubkey"]))
        claimed, signature = binascii.unhexlify(fields["id"]), binascii.unhexlify(fields["sig"])
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    # NIP-01's id, hashed here rather than asked of nostr-sdk (parsing the event into its Rust
    # bindings and reading id and key back cost three times the verification): orjson writes the
    # serialisation rust-nostr writes (no whitespace, UTF-8 verbatim, the same escapes;
    # tests/auth/test_nip98.py compares the two on awkward events). The key in lower-case hex
    # whatever the JSON's case: an id in upper-case hex is the same event, and one id.
    author = pubkey.format().hex()
    event_id = hashlib.sha256(orjson.dumps([0, author, created_at, KIND, listed, content])).digest()
    if claimed != event_id or len(signature) != 64 or not pubkey.verify(signature, event_id):
        return None
    return author, event_id.hex(), created_at


@functools.lru_cache(maxsize=4096)
def _key(pubkey: bytes) -> PublicKeyXOnly:
    """The x-only key of 32 bytes, parsed once per key seen (ValueError: not a key on the curve)."""
    if len(pubkey) != 32:
        raise ValueError("an x-only key is 32 bytes")
    return PublicKeyXOnly(pubkey)


class NostrScheme:
    """NIP-98 on the Public server; ``public_base_url`` names the URL clients use behind a proxy."""

    def __init__(self, store: Store, *, public_base_url: str | None = None) -> None:
        self._store = store
        # Concurrent requests' ids are remembered together, one statement per batch, and with no
        # transaction around it (the primary key decides, statement by statement).
        self._replays: Batcher[tuple[str, int], bool] = Batcher(store, self._remember, limit=SPEND_BATCH, alone=True)
        self._purged_at = 0
        self._public_base_url = None if public_base_url is None else public_base_url.rstrip("/")

    async def _remember(self, conn: AsyncConnection, accepted: Sequence[tuple[str, int]]) -> list[bool]:
        now = int(time.time())
        if now >= self._purged_at + PURGE_INTERVAL:
            self._purged_at = now
            await queries.purge(conn, before=now - REMEMBERED)
        return await queries.remember(conn, accepted)

    async def authenticate(self, request: Request) -> Authenticated | None:
        scheme, _, credentials = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "nostr":
            return None
        now = int(time.time())
        body = request.scope.get(fastpath.BODY)
        url = signed_url(request.scope, self._public_base_url)
        claim = Claim(url, request.method, await request.body() if body is None else body)
        found = verified_pubkey(credentials.strip(" "), claim, now=now)
        if found is None:
            return None
        pubkey, event_id, created_at = found
        user = await queries.user_of(self._store, f"nostr:{pubkey}")
        # The id is spent only by a request that authenticates.
        if user is None or not await self._replays.submit((event_id, created_at)):
            return None

        async def still_linked() -> bool:
            # The stream opened by this request lives as long as the key is linked to the same User.
            linked = await queries.user_of(self._store, f"nostr:{pubkey}")
            return linked is not None and linked.id == user.id

        return Authenticated(user, self, still_valid=still_linked)
