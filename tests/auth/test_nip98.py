"""The NIP-98 scheme (auth/nip98.py, issue 37): every condition, the bearer Token beside it.

The person signs with a second instance of nostr-sdk, as a Nostr client would.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import re
import importlib.util
import time
import types

import httpx
import nostr_sdk
import orjson
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway import clock, config
from agent_gateway.auth import nip98
from agent_gateway.auth.nip98 import WINDOW, Claim, NostrScheme, signed_url, verified_pubkey
from agent_gateway.auth.tokens import PasswordScheme
from agent_gateway.channels import identities
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.store.queries import nostr as nostr_queries
from agent_gateway.store.queries.users import User
from agent_gateway.store.tables import nostr_auth_events

from tests.auth.conftest import MakeUser, bearer, login, token_of

BASE = "http://public"
# One key for the property test's many events (generating one per example would be most of its time).
KEYS = nostr_sdk.Keys.generate()


def header(keys: nostr_sdk.Keys, url: str, method: str, *, body: bytes = b"", created_at: int | None = None,
           kind: int = 27235, extra: list[list[str]] = ()) -> dict[str, str]:
    tags = [["u", url], ["method", method], *extra]
    if body:
        tags.append(["payload", hashlib.sha256(body).hexdigest()])
    builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(kind), "").tags([nostr_sdk.Tag.parse(tag) for tag in tags])
    builder = builder.custom_created_at(nostr_sdk.Timestamp.from_secs(created_at or int(time.time())))
    event = builder.finalize(keys).as_json()
    return {"Authorization": "Nostr " + base64.b64encode(event.encode()).decode()}


@pytest.fixture
def nostr(gateway: Gateway) -> NostrScheme:
    scheme = NostrScheme(gateway.store)
    gateway.auth_schemes.append(scheme)
    return scheme


async def linked(gateway: Gateway, make_user: MakeUser) -> tuple[User, nostr_sdk.Keys]:
    user = await make_user()
    keys = nostr_sdk.Keys.generate()
    async with gateway.store.transaction() as conn:
        await channel_queries.link(conn, identity=f"nostr:{keys.public_key().to_hex()}", channel="nostr",
                                   user_id=user.id, created_at=clock.now_iso())
    return user, keys


async def failure(public: httpx.AsyncClient) -> bytes:
    return (await public.get("/users/me")).content


async def test_a_valid_event_authenticates_the_linked_user(public: httpx.AsyncClient, gateway: Gateway,
                                                            make_user: MakeUser, nostr: NostrScheme):
    user, keys = await linked(gateway, make_user)
    response = await public.get("/users/me", headers=header(keys, f"{BASE}/users/me", "GET"))
    assert response.status_code == 200 and response.json()["id"] == user.id
    # A body signed with its payload digest: the password change works under Nostr.
    body = b'{"currentPassword": "correct horse battery staple", "newPassword": "another one"}'
    headers = {**header(keys, f"{BASE}/auth/password", "PUT", body=body), "Content-Type": "application/json"}
    assert (await public.put("/auth/password", content=body, headers=headers)).status_code == 204
    assert (await login(public, user.id, "another one")).status_code == 201


async def test_every_failed_condition_is_the_one_401(public: httpx.AsyncClient, gateway: Gateway,
                                                      make_user: MakeUser, nostr: NostrScheme):
    _, keys = await linked(gateway, make_user)
    unlinked = nostr_sdk.Keys.generate()
    url, now = f"{BASE}/users/me", int(time.time())
    signed = header(keys, url, "GET")["Authorization"]
    event = base64.b64decode(signed.removeprefix("Nostr ")).decode()
    tampered = event.replace('"content":""', '"content":"x"')
    fields, other = orjson.loads(event), orjson.loads(base64.b64decode(header(keys, url, "PUT")["Authorization"][6:]))

    def edited(**changes: object) -> dict[str, str]:
        return {"Authorization": "Nostr " + base64.b64encode(orjson.dumps({**fields, **changes})).decode()}

    cases = {
        "unlinked key": header(unlinked, url, "GET"),
        "other url": header(keys, f"{BASE}/users/me?x=1", "GET"),
        "other host": header(keys, "http://elsewhere/users/me", "GET"),
        "other method": header(keys, url, "POST"),
        "too old": header(keys, url, "GET", created_at=now - WINDOW - 30),
        "too new": header(keys, url, "GET", created_at=now + WINDOW + 30),
        "other kind": header(keys, url, "GET", kind=27236),
        "content changed after signing": {"Authorization": "Nostr " + base64.b64encode(tampered.encode()).decode()},
        "another event's signature": edited(sig=other["sig"]),
        "a signature's bit flipped": edited(sig=fields["sig"][:-1] + "0123456789abcdef"[int(fields["sig"][-1], 16) ^ 1]),
        "short signature": edited(sig=fields["sig"][:-2]),
        "non-hex signature": edited(sig="zz" + fields["sig"][2:]),
        "another event's id": edited(id=other["id"]),
        "non-hex id": edited(id="zz" + fields["id"][2:]),
        "no id": {"Authorization": "Nostr " + base64.b64encode(orjson.dumps({**fields, "id": None})).decode()},
        "another key": edited(pubkey=unlinked.public_key().to_hex()),
        "short key": edited(pubkey=fields["pubkey"][:-2]),
        "non-hex key": edited(pubkey="zz" + fields["pubkey"][2:]),
        "key off the curve": edited(pubkey="f" * 64),
        "key not a string": edited(pubkey=1),
        "content not a string": edited(content=None),
        "a tag value not a string": edited(tags=[*fields["tags"], ["nonce", 1]]),
        "a tag not a list": edited(tags=[*fields["tags"], "nonce"]),
        "an empty tag": edited(tags=[*fields["tags"], []]),
        "not base64": {"Authorization": "Nostr !!!"},
        "not an event": {"Authorization": "Nostr " + base64.b64encode(b"{}").decode()},
        "empty": {"Authorization": "Nostr"},
    }
    expected = await failure(public)
    for name, headers in cases.items():
        response = await public.get("/users/me", headers=headers)
        assert (response.status_code, response.content) == (401, expected), name


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Credentials no event is behind, as a hostile client may send them (Starlette reads the header's bytes
# as latin-1, so any of 0x80-0xFF arrives as a character): each is the one 401, never an exception.
HOSTILE = {
    "a character past ASCII": "\xe9AAAA",
    "only characters past ASCII": "\xff\xfe\xfd\xfc",
    "a NUL": "AAA\x00",
    "a NUL alone": "\x00",
    "a control character": "AA\x7fA",
    "whitespace inside": "AA AA",
    "padding only": "====",
    "not UTF-8": b64(b"\xff\xfe{}"),
    "a lone surrogate": b64(b'{"kind": "\\ud800"}'),
    "a NUL in a JSON string": b64(b'{"content": "a\x00b"}'),
    "nested past any depth": b64(b"[" * 5000 + b"]" * 5000),
    "objects nested past any depth": b64(b'{"a":' * 2000 + b"1" + b"}" * 2000),
    "NaN": b64(b'{"created_at": NaN}'),
    "a number past a double": b64(b'{"created_at": 1e400}'),
    "an integer past 64 bits": b64(b'{"kind": 27235, "created_at": 123456789012345678901234567890}'),
    "a JSON array": b64(b"[]"),
    "a JSON string": b64(b'"Nostr"'),
    "JSON null": b64(b"null"),
    "trailing garbage": b64(b"{} x"),
}


@pytest.mark.parametrize("credentials", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_malformed_credential_is_refused_without_an_error(credentials: str):
    assert verified_pubkey(credentials, Claim(f"{BASE}/users/me", "GET", b""), now=int(time.time())) is None


def test_an_event_with_a_field_of_the_wrong_type_or_size_is_refused_without_an_error():
    keys, now, url = nostr_sdk.Keys.generate(), int(time.time()), f"{BASE}/users/me"
    fields = orjson.loads(base64.b64decode(header(keys, url, "GET", created_at=now)["Authorization"][6:]))
    claim = Claim(url, "GET", b"")
    assert verified_pubkey(b64(orjson.dumps(fields)), claim, now=now) is not None
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    changes = {
        "kind": [27235.0, "27235", True, [27235], 27235 + 2**32, None],
        "created_at": [float(now), str(now), True, 2**64 - 1, -(2**63), [now], None],
        "tags": [None, {}, "u", [["u", url], ["method", "GET"], [1]], [["u", url], ["method", "GET"], deep],
                 [[["u"], url], ["method", "GET"]], [["u", [url]], ["method", "GET"]]],
        "pubkey": ["\xe9" * 64, "\x00" * 64, "0" * 64, "0" * 66, [fields["pubkey"]], {}, 1.5, 2**64 - 1],
        "id": ["\xe9" * 64, "\x00" * 64, fields["id"] + "00", [fields["id"]], 2**63],
        "sig": ["\xe9" * 128, "\x00" * 128, "0" * 130, "", [fields["sig"]], None],
        "content": [1, [], {}, None, "\x00"],
    }
    for name, values in changes.items():
        for value in values:
            edited = {**fields, name: value}
            assert verified_pubkey(b64(orjson.dumps(edited)), claim, now=now) is None, (name, value)
    for name in changes:
        missing = {key: value for key, value in fields.items() if key != name}
        assert verified_pubkey(b64(orjson.dumps(missing)), claim, now=now) is None, name


# Any JSON value orjson writes (integers within 64 bits, finite floats).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
# A valid event's fields, at a fixed time.
SIGNED = orjson.loads(base64.b64decode(header(KEYS, f"{BASE}/users/me", "GET", created_at=2_000_000_000)["Authorization"][6:]))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(SIGNED)), value=JSON)
def test_an_event_with_any_field_replaced_is_refused_without_an_error(name: str, value: object):
    if value == SIGNED[name] and type(value) is type(SIGNED[name]):
        return
    credentials = b64(orjson.dumps({**SIGNED, name: value}))
    assert verified_pubkey(credentials, Claim(f"{BASE}/users/me", "GET", b""), now=2_000_000_000) is None


@settings(max_examples=300, deadline=None)
@given(credentials=st.text() | st.binary().map(lambda data: data.decode("latin-1")) | st.binary().map(b64))
def test_any_credential_is_an_answer_never_an_error(credentials: str):
    assert verified_pubkey(credentials, Claim(f"{BASE}/users/me", "GET", b""), now=int(time.time())) is None


async def test_a_malformed_header_is_the_one_401_on_the_fast_path_and_the_routes(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, nostr: NostrScheme
):
    await linked(gateway, make_user)
    expected = await failure(public)
    # Bytes, sent as they are: /users/me and /messages are fast routes, /ledger/entries and /decisions/1 FastAPI's.
    headers = [b"Nostr \xe9AAAA", b"Nostr \xff", b"nostr  \x80\x81 ",
               *(b"Nostr " + value.encode("latin-1") for value in HOSTILE.values())]
    for path in ("/users/me", "/messages", "/ledger/entries", "/decisions/1"):
        for value in headers:
            response = await public.get(path, headers={"Authorization": value})
            assert (response.status_code, response.content) == (401, expected), (path, value)


def scope_of(raw_path: bytes | None, query: bytes = b"", *, host: bytes | None = b"gateway.example:8080",
             path: str = "/decoded") -> dict[str, object]:
    scope = {"type": "http", "scheme": "http", "server": ("127.0.0.1", 9000), "path": path, "query_string": query,
             "headers": [] if host is None else [(b"host", host)]}
    if raw_path is not None:
        scope["raw_path"] = raw_path
    return scope


def test_the_signed_url_is_the_request_as_sent():
    # The path and query as they came, percent-encoding included; the origin from the Host header.
    assert signed_url(scope_of(b"/ledger/entries/%31")) == "http://gateway.example:8080/ledger/entries/%31"
    assert signed_url(scope_of(b"/a%2Fb", b"x=%2F&y=a%2fb")) == "http://gateway.example:8080/a%2Fb?x=%2F&y=a%2fb"
    assert signed_url(scope_of(b"/users/me", host=None)) == "http://127.0.0.1:9000/users/me"
    # Raw UTF-8 in a query is the text signed; a byte that is not UTF-8 can match no event, and is no error.
    assert signed_url(scope_of(b"/m", "q=é".encode())) == "http://gateway.example:8080/m?q=é"
    assert "\udcff" in signed_url(scope_of(b"/m", b"q=\xff"))
    # Without a raw path (an ASGI server need not give one), the path.
    assert signed_url(scope_of(None, b"a=1", path="/users/me")) == "http://gateway.example:8080/users/me?a=1"
    # Behind a proxy the public base URL, its own path included, stands before the path as forwarded.
    assert signed_url(scope_of(b"/d/%31", b"a=1"), "https://gw.example.org") == "https://gw.example.org/d/%31?a=1"
    prefixed = signed_url(scope_of(b"/users/me"), "https://gw.example.org/prefix")
    assert prefixed == "https://gw.example.org/prefix/users/me"


async def test_a_percent_encoded_url_is_signed_as_sent(public: httpx.AsyncClient, agent: httpx.AsyncClient,
                                                       gateway: Gateway, make_user: MakeUser, nostr: NostrScheme):
    _, keys = await linked(gateway, make_user)
    assert (await agent.post("/decisions", json={"statement": "one"})).status_code == 201
    assert (await public.get("/decisions/%31")).status_code == 401
    # Fast routes (/decisions/{seq}/proof, /checkpoint/consistency) and FastAPI's, in the path and in the query.
    for sent, decoded in [("/decisions/%31/proof", "/decisions/1/proof"), ("/ledger/entries/%31", "/ledger/entries/1"),
                          ("/checkpoint/consistency?from=%31", "/checkpoint/consistency?from=1"),
                          ("/ledger/checkpoint/consistency?from=%31", "/ledger/checkpoint/consistency?from=1")]:
        refused = await public.get(sent, headers=header(keys, f"{BASE}{decoded}", "GET"))
        assert (refused.status_code, refused.content) == (401, await failure(public)), sent
        accepted = await public.get(sent, headers=header(keys, f"{BASE}{sent}", "GET"))
        assert accepted.status_code in (200, 404), (sent, accepted.status_code, accepted.text)
    # Behind a proxy, the same: the base URL and the path as sent.
    gateway.auth_schemes[:] = [NostrScheme(gateway.store, public_base_url="https://gateway.example.org/gw")]
    proxied = "https://gateway.example.org/gw/ledger/entries/%32"
    refused = await public.get("/ledger/entries/%32", headers=header(keys, proxied.replace("%32", "2"), "GET"))
    assert refused.status_code == 401
    assert (await public.get("/ledger/entries/%32", headers=header(keys, proxied, "GET"))).status_code == 404


# Strings NIP-01's serialisation must write exactly as rust-nostr does: escapes, every control
# character, DEL, non-ASCII (\u2028, astral), quotes, backslashes, the empty string.
AWKWARD = ["", '"', "\\", "\\u0041", "/", "\x7f", "\u2028\u2029", "é ü ß ∑ 漢字 🙂", "\ufeff", "a\u0000b",
           "".join(map(chr, range(32))), '{"kind":1}', "\\n literal"]


def test_the_event_id_is_the_one_nostr_sdk_computes():
    keys, now, url = nostr_sdk.Keys.generate(), int(time.time()), f"{BASE}/users/me"
    cases = [(text, [[text], ["t", text, text], [text[:1] or "x"]]) for text in AWKWARD]
    cases += [("", [["x", ""]]), ("".join(AWKWARD), [list(AWKWARD)])]
    for content, extra in cases:
        tags = [["u", url], ["method", "GET"], *extra]
        builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(27235), content)
        builder = builder.tags([nostr_sdk.Tag.parse(tag) for tag in tags]).custom_created_at(nostr_sdk.Timestamp.from_secs(now))
        event = builder.finalize(keys)
        credentials = base64.b64encode(event.as_json().encode()).decode()
        found = verified_pubkey(credentials, Claim(url, "GET", b""), now=now)
        assert found == (keys.public_key().to_hex(), event.id().to_hex(), now), (content, extra)


@settings(max_examples=300, deadline=None)
@given(content=st.text(), values=st.lists(st.lists(st.text(), min_size=1, max_size=3), max_size=3))
def test_the_event_id_is_the_one_nostr_sdk_computes_on_any_text(content: str, values: list[list[str]]):
    keys, now, url = KEYS, int(time.time()), f"{BASE}/users/me"
    tags = [["u", url], ["method", "GET"], *values]
    builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(27235), content)
    builder = builder.tags([nostr_sdk.Tag.parse(tag) for tag in tags]).custom_created_at(nostr_sdk.Timestamp.from_secs(now))
    event = builder.finalize(keys)
    credentials = base64.b64encode(event.as_json().encode()).decode()
    assert verified_pubkey(credentials, Claim(url, "GET", b""), now=now) == (keys.public_key().to_hex(), event.id().to_hex(), now)


async def test_a_body_needs_its_payload_digest(public: httpx.AsyncClient, gateway: Gateway,
                                               make_user: MakeUser, nostr: NostrScheme):
    _, keys = await linked(gateway, make_user)
    body = b'{"currentPassword": "correct horse battery staple", "newPassword": "another one"}'
    url = f"{BASE}/auth/password"
    for headers in (header(keys, url, "PUT"), header(keys, url, "PUT", body=b"other bytes")):
        response = await public.put("/auth/password", content=body, headers={**headers, "Content-Type": "application/json"})
        assert (response.status_code, response.content) == (401, await failure(public))


async def test_a_replayed_event_is_refused(public: httpx.AsyncClient, gateway: Gateway,
                                           make_user: MakeUser, nostr: NostrScheme):
    _, keys = await linked(gateway, make_user)
    headers = header(keys, f"{BASE}/users/me", "GET")
    assert (await public.get("/users/me", headers=headers)).status_code == 200
    assert (await public.get("/users/me", headers=headers)).status_code == 401


async def remember(gateway: Gateway, *accepted: tuple[str, int]) -> list[bool]:
    # As the scheme remembers them: one statement with no transaction around it.
    async with gateway.store.alone() as conn:
        return await nostr_queries.remember(conn, list(accepted))


async def purge(gateway: Gateway, before: int) -> None:
    async with gateway.store.alone() as conn:
        await nostr_queries.purge(conn, before=before)


async def remembered(gateway: Gateway) -> int:
    async with gateway.store.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(nostr_auth_events))).scalar_one()


async def test_a_replayed_id_is_forgotten_only_by_a_purge_past_its_created_at(gateway: Gateway):
    assert await remember(gateway, ("a" * 64, 1000)) == [True]
    await purge(gateway, 1000)
    assert await remember(gateway, ("a" * 64, 1000)) == [False]
    # A purge past it removes it (the scheme refuses its event on created_at by then).
    await purge(gateway, 1001)
    assert await remember(gateway, ("a" * 64, 1000)) == [True]


async def test_one_event_twice_in_one_batch_is_accepted_once(gateway: Gateway):
    assert await remember(gateway, ("c" * 64, 1000), ("d" * 64, 1001), ("c" * 64, 1000)) == [True, True, False]
    assert await remember(gateway, ("d" * 64, 1001), ("e" * 64, 1001)) == [False, True]


async def test_the_scheme_purges_expired_ids_at_most_once_a_second(public: httpx.AsyncClient, gateway: Gateway,
                                                                    make_user: MakeUser, nostr: NostrScheme,
                                                                    monkeypatch: pytest.MonkeyPatch):
    _, keys = await linked(gateway, make_user)
    now = int(time.time())
    monkeypatch.setattr(nip98, "time", types.SimpleNamespace(time=lambda: now))

    async def accepted(nonce: int) -> bool:
        headers = header(keys, f"{BASE}/users/me", "GET", created_at=now, extra=[["nonce", str(nonce)]])
        return (await public.get("/users/me", headers=headers)).status_code == 200

    expired = now - nip98.REMEMBERED - 1
    await remember(gateway, ("0" * 64, expired), ("f" * 64, expired + 1))
    assert await accepted(1)
    assert await remembered(gateway) == 2  # the expired id gone, the one still remembered kept, the new one in
    await remember(gateway, ("1" * 64, expired))
    assert await accepted(2)
    assert await remembered(gateway) == 4  # the same second: no purge
    now += nip98.PURGE_INTERVAL
    assert await accepted(3)
    assert await remembered(gateway) == 3  # two more expired (one just now), the new one in


async def test_requests_at_once_with_one_event_are_accepted_once(public: httpx.AsyncClient, gateway: Gateway,
                                                                make_user: MakeUser, nostr: NostrScheme):
    user, keys = await linked(gateway, make_user)
    headers = header(keys, f"{BASE}/users/me", "GET")
    others = [header(keys, f"{BASE}/users/me", "GET", extra=[["nonce", str(number)]]) for number in range(6)]
    answers = await asyncio.gather(*(public.get("/users/me", headers=h) for h in [headers] * 6 + others))
    assert sorted(answer.status_code for answer in answers[:6]) == [200] + [401] * 5
    assert all(answer.status_code == 200 and answer.json()["id"] == user.id for answer in answers[6:])


async def test_a_public_base_url_is_the_signed_url(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    gateway.auth_schemes.append(NostrScheme(gateway.store, public_base_url="https://gateway.example.org/"))
    _, keys = await linked(gateway, make_user)
    proxied = header(keys, "https://gateway.example.org/users/me", "GET")
    assert (await public.get("/users/me", headers=proxied)).status_code == 200
    assert (await public.get("/users/me", headers=header(keys, f"{BASE}/users/me", "GET"))).status_code == 401


async def test_bearer_tokens_work_beside_it_and_delete_current_drops_nothing(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, nostr: NostrScheme
):
    user, keys = await linked(gateway, make_user)
    token = await token_of(public, user.id)
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 200
    current = f"{BASE}/auth/tokens/current"
    assert (await public.delete("/auth/tokens/current", headers=header(keys, current, "DELETE"))).status_code == 204
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 200
    # DELETE /auth/tokens under Nostr revokes that User's Tokens.
    assert (await public.delete("/auth/tokens", headers=header(keys, f"{BASE}/auth/tokens", "DELETE"))).status_code == 204
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 401


def settings_of(tmp_path, text: str) -> config.Settings:
    path = tmp_path / "gateway.toml"
    path.write_text("[auth]\ntoken_ttl_ms = 60000\n" + text)
    return config.load(path, environ={})


def refusal(tmp_path, text: str) -> str:
    with pytest.raises(config.SettingsError) as caught:
        settings_of(tmp_path, text)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_the_schemes_are_registered_in_the_settings_order(tmp_path, settings: config.Settings):
    assert settings_of(tmp_path, "").auth_schemes == ("password",)
    loaded = settings_of(tmp_path, 'schemes = ["nostr", "password"]\n[public]\nbase_url = "https://gw.example.org/"\n')
    assert (loaded.auth_schemes, loaded.public_base_url) == (("nostr", "password"), "https://gw.example.org")
    gateway = Gateway(dataclasses.replace(settings, auth_schemes=loaded.auth_schemes))
    assert [type(scheme) for scheme in gateway.auth_schemes] == [NostrScheme, PasswordScheme]


@pytest.mark.parametrize(("text", "words"), [
    ('schemes = ["password", "kerberos"]', "auth.schemes: each entry must be one of"),
    ('schemes = ["password", "password"]', "auth.schemes: name each scheme once"),
    ("schemes = []", "auth.schemes: name each scheme once"),
    ('schemes = "nostr"', "auth.schemes: must be a list"),
    ('[public]\nbase_url = "gateway.example.org"', "public.base_url: must be an http(s) URL"),
    ('[public]\nbase_url = "https://gw.example.org/?a=1"', "public.base_url: must be an http(s) URL"),
])
def test_a_scheme_settings_error_is_refused_in_one_line(tmp_path, text: str, words: str):
    assert refusal(tmp_path, text).startswith(words)


def test_the_nostr_scheme_without_its_library_is_refused_naming_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "coincurve" else real(name, *a))
    message = refusal(tmp_path, 'schemes = ["password", "nostr"]')
    assert message == "auth.schemes: \"nostr\" needs the nostr extra: pip install 'agent-gateway[nostr]'"
    assert settings_of(tmp_path, "").auth_schemes == ("password",)


def test_a_nostr_identity_is_stored_in_hex_from_hex_or_npub():
    keys = nostr_sdk.Keys.generate()
    hex_key = keys.public_key().to_hex()
    for written in (hex_key, hex_key.upper(), keys.public_key().to_bech32()):
        assert identities.parse(f"nostr:{written}") == ("nostr", hex_key)
    for bad in ("nostr:", "nostr:abc", f"nostr:{hex_key}0", "nostr:npub1notakey"):
        with pytest.raises(identities.InvalidIdentity):
            identities.parse(bad)


async def test_a_user_linked_by_npub_authenticates_by_nip98(public: httpx.AsyncClient, gateway: Gateway,
                                                           make_user: MakeUser, nostr: NostrScheme):
    user, keys = await make_user(), nostr_sdk.Keys.generate()
    async with gateway.store.transaction() as conn:
        await identities.link(conn, user.id, f"nostr:{keys.public_key().to_bech32()}")
    response = await public.get("/users/me", headers=header(keys, f"{BASE}/users/me", "GET"))
    assert (response.status_code, response.json()["id"]) == (200, user.id)
    async with gateway.store.transaction() as conn:
        await identities.unlink(conn, user.id, f"nostr:{keys.public_key().to_bech32()}")
    assert (await public.get("/users/me", headers=header(keys, f"{BASE}/users/me", "GET"))).status_code == 401


async def test_an_event_accepted_by_one_gateway_is_refused_by_another_on_the_same_database(
    public: httpx.AsyncClient, gateway: Gateway, settings: config.Settings, make_user: MakeUser, nostr: NostrScheme
):
    # Two gateways (two engines, two connection pools) on one database, as two HTTP processes are.
    other = Gateway(dataclasses.replace(settings, auth_schemes=("password", "nostr")))
    await other.start(migrate_first=False)
    try:
        _, keys = await linked(gateway, make_user)
        headers = header(keys, f"{BASE}/users/me", "GET")
        assert (await public.get("/users/me", headers=headers)).status_code == 200
        transport = httpx.ASGITransport(app=other.public_asgi)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as second:
            # Another event (an id covers created_at: the same request signed in the same second is a replay).
            fresh = header(keys, f"{BASE}/users/me", "GET", created_at=int(time.time()) - 1, extra=[["nonce", "1"]])
            assert (await second.get("/users/me", headers=fresh)).status_code == 200
            assert (await second.get("/users/me", headers=headers)).status_code == 401
    finally:
        await other.stop()


# A body for each protected route that takes one; a new such route must be given one here.
BODIES = {
    ("POST", "/messages"): {"text": "hello under nostr"},
    ("POST", "/verify"): {"jws": "a.b.c"},
    ("PUT", "/auth/password"): {"currentPassword": "correct horse battery staple", "newPassword": "another one"},
}
# A query for each protected route that needs one.
QUERIES = {("GET", "/checkpoint/consistency"): "?from=1", ("GET", "/ledger/checkpoint/consistency"): "?from=1"}
# Routes answering 401 that are not protected: the login (a wrong password); and the stream, followed
# by the served tests (tests/auth/test_nip98_served.py), since a stream does not end in process.
NOT_HERE = {("POST", "/auth/tokens"), ("GET", "/messages/stream")}


async def test_every_protected_public_route_works_under_nip98(public: httpx.AsyncClient, agent: httpx.AsyncClient,
                                                             gateway: Gateway, make_user: MakeUser, nostr: NostrScheme):
    user, keys = await linked(gateway, make_user)
    assert (await agent.post("/decisions", json={"statement": "one"})).status_code == 201
    routes = [
        (method.upper(), path)
        for path, operations in (await public.get("/openapi.json")).json()["paths"].items()
        for method, operation in operations.items()
        if "401" in operation.get("responses", {}) and (method.upper(), path) not in NOT_HERE
    ]
    assert ("GET", "/users/me") in routes and ("POST", "/messages") in routes
    # The password change last: the others need nothing of it.
    for method, path in sorted(routes, key=lambda route: route == ("PUT", "/auth/password")):
        concrete = re.sub(r"\{[^}]+\}", "1", path) + QUERIES.get((method, path), "")
        body = BODIES.get((method, path))
        content = b"" if body is None else orjson.dumps(body)
        headers = header(keys, f"{BASE}{concrete}", method, body=content)
        if body is not None:
            headers["Content-Type"] = "application/json"
        response = await public.request(method, concrete, content=content or None, headers=headers)
        # Authenticated and answered (a 404 is the route's own: no witnessed checkpoint yet, say).
        assert response.status_code in (200, 201, 204, 404), (method, path, response.status_code, response.text)
    # Another event for the same request (the loop's, in the same second, would be a replay).
    again = header(keys, f"{BASE}/messages", "GET", extra=[["nonce", "again"]])
    messages = (await public.get("/messages", headers=again)).json()["messages"]
    assert [message["text"] for message in messages if message["direction"] == "inbound"] == ["hello under nostr"]
    assert (await login(public, user.id, "another one")).status_code == 201
