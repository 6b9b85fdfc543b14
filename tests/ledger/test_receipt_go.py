"""A real receipt checked by another implementation: Go's ``golang.org/x/mod/sumdb/note`` for the
ledger's checkpoint and ``sumdb/tlog`` for the inclusion of each entry (tests/transparency/gocheck's
``receipt``), the leaves made here by hand from what the User knows (their text, the template the
instructions publish): RFC 8785 canonical JSON written out for these entries' known shapes, never
the project's encoder. Skipped without Go unless ``AGENT_GATEWAY_TEST_REQUIRE_GO=1``."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import httpx
import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.transparency import note
from tests.ledger.test_receipt import HANDLERS, TEXT, public, receipt_of, send, user, written  # noqa: F401
from tests.signals.conftest import GatewayFactory, Recording
from tests.transparency.test_go import check, gocheck  # noqa: F401

pytestmark = pytest.mark.processes


@pytest.fixture
async def gateway(make_gateway: GatewayFactory) -> Gateway:
    return await make_gateway(Recording(), handlers=HANDLERS)


def string(text: str) -> str:
    """A JSON string as RFC 8785 writes it for text with no control character: UTF-8 as is, only
    the quote and the backslash escaped."""
    assert all(ord(c) >= 0x20 for c in text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_leaf(receipt: dict, text: str) -> bytes:
    """The Run's entry as the User rebuilds it: their Message with its text, the Prompt the published
    template makes of it (written out here), and the Run's own fields from the receipt."""
    message, signal = receipt["message"], receipt["signal"]
    entry = json.loads(receipt["runs"][0]["leaf"])
    payload = (
        f'{{"createdAt":{string(message["createdAt"])},"direction":"inbound","id":{string(message["id"])},'
        f'"seq":{message["seq"]},"text":{string(text)},"userId":{string(message["userId"])}}}'
    )
    prompt = f"Message {message['seq']} from {message['userId']} (Signal {signal['id']}):\n{text}"
    return (
        f'{{"instructions":1,"kind":"message.received","origin":"message","payload":"{sha256(payload)}",'
        f'"prompt":"{sha256(prompt)}",'
        f'"run":{string(entry["run"])},"session":{string("user_" + message["userId"])},"signal":{string(signal["id"])},'
        f'"startedAt":{string(entry["startedAt"])},"type":"run"}}'
    ).encode()


def instructions_leaf(receipt: dict, template: str) -> bytes:
    """The instructions entry with the template the User was shown: sorted keys and no whitespace
    are RFC 8785 for this shape (ASCII member names, no numbers but small integers)."""
    entry = json.loads(receipt["instructions"][0]["leaf"])
    [handler] = entry["instructions"]["handlers"]
    handler["template"] = template
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


async def test_go_verifies_a_receipt_with_leaves_made_by_hand(
    gateway: Gateway, public: httpx.AsyncClient, gocheck: Path, tmp_path: Path  # noqa: F811
) -> None:
    alice = await user(gateway)
    message = await send(public, alice, TEXT)
    receipt = await receipt_of(public, alice, message["seq"])
    path = written(tmp_path, receipt)
    [jwk] = gateway.identity.jwks()["keys"]
    origin = receipt["checkpoint"].split("\n", 1)[0]
    vkey = note.note_keys(origin, jwk)[0].vkey()
    template = HANDLERS["message.received"]["template"]

    def go(text: str = TEXT, shown: str = template, key: str = vkey, receipt_path: Path = path) -> str | None:
        run = written(tmp_path, run_leaf(receipt, text).decode(), "run.leaf")
        told = written(tmp_path, instructions_leaf(receipt, shown).decode(), "instructions.leaf")
        return check(gocheck, "receipt", key, receipt_path, run, told)

    assert go() is None
    # The text changed by one character, another User's text, a template other than the one published.
    assert go(text=TEXT.replace("Thursday", "Thursdey")) is not None
    assert go(text="Bob's own words") is not None
    assert go(shown=template.replace("Message", "Note")) is not None
    # A checkpoint byte changed, and another key's name.
    bent = dict(receipt, checkpoint=receipt["checkpoint"].replace("\n", "\n1", 1))
    assert go(receipt_path=written(tmp_path, bent, "bent.json")) is not None
    other = note.note_keys("example.com/log", jwk)[0].vkey()
    assert go(key=other) is not None
    # The refusals are Go's: a changed proof hash is refused too.
    hashes = receipt["runs"][0]["hashes"]
    raw = bytearray(base64.b64decode(hashes[0]))
    raw[0] ^= 1
    bent_proof = json.loads(json.dumps(receipt))
    bent_proof["runs"][0]["hashes"] = [base64.b64encode(bytes(raw)).decode(), *hashes[1:]]
    assert go(receipt_path=written(tmp_path, bent_proof, "bent-proof.json")) is not None
