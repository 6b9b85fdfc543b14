"""NIP-98 against real ``serve`` processes: the replay check across two OS processes, the stream.

The person signs with nostr-sdk (tests.auth.test_nip98.header), as a Nostr client would.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import nostr_sdk
import pytest

from tests import served
from tests.auth.test_nip98 import HOSTILE, header
from tests.http.test_connections import exchange
from tests.messages.records import assert_error
from tests.streams.sse import CEILING_S, open_stream

pytestmark = pytest.mark.processes

# Both processes are behind one public URL, as behind a proxy: one signed event is valid at either.
BASE = "https://gateway.example"
NOSTR = {
    "AGENT_GATEWAY_AUTH_SCHEMES": json.dumps(["password", "nostr"]),
    "AGENT_GATEWAY_PUBLIC_BASE_URL": BASE,
    "AGENT_GATEWAY_STREAMS_AUTH_CHECK_MS": "100",
    "AGENT_GATEWAY_STREAMS_KEEP_ALIVE_MS": "100",
    "AGENT_GATEWAY_RUNTIME_COMMAND": '["true"]',
    "AGENT_GATEWAY_RUNTIME_MODE": "per-run",
}


async def cli(gateway: served.ServedGateway, *args: str) -> str:
    # In a thread: the command runs its own event loop.
    result = await asyncio.to_thread(gateway.cli_here, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def linked_user(gateway: served.ServedGateway) -> tuple[str, nostr_sdk.Keys]:
    user = json.loads(await cli(gateway, "users", "add"))
    keys = nostr_sdk.Keys.generate()
    await cli(gateway, "users", "link", user["id"], f"nostr:{keys.public_key().to_bech32()}")
    return user["id"], keys


async def test_an_event_is_accepted_once_across_two_processes(tmp_path: Path, postgres_databases) -> None:
    # Two serving processes share one database on PostgreSQL only (SQLite: one serving process).
    with (
        postgres_databases.url(migrated=True) as database_url,
        served.ServedGateway.start(tmp_path / "one", database_url, NOSTR) as one,
        served.ServedGateway.start(tmp_path / "two", database_url, NOSTR) as two,
    ):
        user_id, keys = await linked_user(one)
        async with httpx.AsyncClient(timeout=CEILING_S) as client:
            for _ in range(5):
                headers = header(keys, f"{BASE}/users/me", "GET", extra=[["nonce", nostr_sdk.Keys.generate().public_key().to_hex()]])
                # The same event at both processes at once: exactly one of them accepts it.
                answers = await asyncio.gather(
                    client.get(f"{one.public_url}/users/me", headers=headers),
                    client.get(f"{two.public_url}/users/me", headers=headers),
                )
                assert sorted(answer.status_code for answer in answers) == [200, 401]
                accepted = next(answer for answer in answers if answer.status_code == 200)
                assert accepted.json()["id"] == user_id
                assert_error(next(answer for answer in answers if answer.status_code == 401), 401)


async def test_a_stream_opened_by_nip98_lives_while_the_key_is_linked(tmp_path: Path, database_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", database_url, NOSTR) as gateway:
        user_id, keys = await linked_user(gateway)
        headers = header(keys, f"{BASE}/messages/stream", "GET")
        async with httpx.AsyncClient(timeout=CEILING_S) as client:
            async with open_stream(client, f"{gateway.public_url}/messages/stream", headers=headers) as stream:
                # The event was spent opening the stream, and the stream is checked every 100 ms:
                # Messages written well after several checks still arrive.
                for text in ("first", "second"):
                    for _ in range(3):
                        comment = await stream.next()
                        assert comment is not None and comment.event is None
                    sent = await client.post(f"{gateway.agent_url}/messages", json={"userId": user_id, "text": text})
                    assert sent.status_code == 201, sent.text
                    [message] = await stream.messages(1)
                    assert message["text"] == text
                await cli(gateway, "users", "unlink", user_id, f"nostr:{keys.public_key().to_hex()}")
                while (event := await stream.next()) is not None:
                    assert event.event is None  # only keep-alives until the end


# The Nostr scheme on the URL the gateway is reached at (no proxy): the Host header as sent.
DIRECT = {name: value for name, value in NOSTR.items() if name != "AGENT_GATEWAY_PUBLIC_BASE_URL"}


def raw_get(url: str, target: bytes, authorization: bytes) -> tuple[int, bytes]:
    """The status and body of ``GET target`` with ``authorization``'s bytes as they are, over a socket of its own."""
    host = url.removeprefix("http://").encode()
    request = b"GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n" % (
        target, host, authorization)
    head, _, body = exchange(url, request).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_a_malformed_header_is_the_one_401_with_no_traceback(tmp_path: Path, database_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", database_url, DIRECT) as gateway:
        await linked_user(gateway)
        expected = await asyncio.to_thread(raw_get, gateway.public_url, b"/users/me", b"Basic none")
        assert expected[0] == 401
        # Bytes 0x80-0xFF reach the scheme as latin-1 characters; the rest are events no JSON parser takes.
        # (The HTTP parser answers a NUL or DEL in a header itself, 400: the scheme never sees them.)
        values = [b"Nostr \xe9AAAA", b"Nostr \xff\xfe\xfd\xfc", b"nostr \x80"]
        values += [b"Nostr " + value.encode("latin-1") for value in HOSTILE.values() if not {"\x00", "\x7f"} & set(value)]
        # /users/me and /messages are fast routes (http/fastpath.py), /ledger/entries and /decisions/1 FastAPI's.
        for target in (b"/users/me", b"/messages", b"/ledger/entries", b"/decisions/1"):
            for value in values:
                assert await asyncio.to_thread(raw_get, gateway.public_url, target, value) == expected, (target, value)
        # A byte past ASCII in the request target: the HTTP parser refuses it (400) before any scheme; no error either way.
        assert (await asyncio.to_thread(raw_get, gateway.public_url, b"/users/me?\xff", b"Nostr \xe9"))[0] in (400, 401)
        output = gateway.output()
        assert "Traceback" not in output and " ERROR " not in output, output


async def test_a_percent_encoded_url_is_signed_as_sent(tmp_path: Path, database_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", database_url, DIRECT) as gateway:
        _, keys = await linked_user(gateway)
        async with httpx.AsyncClient(timeout=CEILING_S) as client:
            assert (await client.post(f"{gateway.agent_url}/decisions", json={"statement": "one"})).status_code == 201
            expected = (await client.get(f"{gateway.public_url}/users/me")).content
            # httpx sends a URL's percent-encoding as written: the fast path's /decisions/{seq}/proof and
            # FastAPI's routes, the escape in the path or in the query.
            for sent, decoded in [("/decisions/%31/proof", "/decisions/1/proof"),
                                  ("/ledger/entries/%31", "/ledger/entries/1"),
                                  ("/ledger/checkpoint/consistency?from=%31", "/ledger/checkpoint/consistency?from=1")]:
                url = f"{gateway.public_url}{sent}"
                refused = await client.get(url, headers=header(keys, f"{gateway.public_url}{decoded}", "GET"))
                assert_error(refused, 401)
                assert refused.content == expected
                accepted = await client.get(url, headers=header(keys, url, "GET"))
                assert accepted.status_code in (200, 404), (sent, accepted.status_code, accepted.text)
