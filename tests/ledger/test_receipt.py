"""A User's receipt (issue 41) on both backends: GET /messages/{seq}/receipt for one's own inbound
Message, and ``agent-gateway verify-receipt``, which accepts it for the text as written, naming the
Message and its User, and refuses, in one line naming what differs, another text (one character
changed, another User's), another User's receipt (--user), a template changed after the fact, a bad
signature, a bad proof, another key and malformed files."""

from __future__ import annotations

import base64
import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from typer.testing import CliRunner

from agent_gateway.cli.main import app
from agent_gateway.gateway import Gateway
from agent_gateway.ledger import receipt
from agent_gateway.signals import retention
from agent_gateway.signals.handlers import Prompt, TemplateHandler
from agent_gateway.store.queries.signals import Signal
from agent_gateway.transparency import note, proof, service
from agent_gateway.users import service as users
from tests.signals.conftest import GatewayFactory, Recording, until
from tests.signatures.helpers import BearerTestScheme
from tests.transparency.test_routes import assert_error

pytestmark = pytest.mark.processes

TEMPLATE = "Message {{ seq }} from {{ userId }} (Signal {{ signal.id }}):\n{{ text }}"
HANDLERS = {"message.received": {"template": TEMPLATE, "session": "user_{{ userId }}"}}
TEXT = "Please book the room for Thursday, 10:00 — thank you!"


def vkey(gateway: Gateway) -> str:
    """The gateway's vkey as ``agent-gateway keys show`` prints it (the Decision log's)."""
    return service.signer(gateway.settings, gateway.identity).key.vkey()


def verify_receipt(path: Path, text: str, key: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["verify-receipt", str(path), "--text", text, "--key", key, *args])
    output = (result.stdout + (result.stderr or "")).strip()
    assert "\n" not in output and "Traceback" not in output, output
    return result.exit_code, output


async def user(gateway: Gateway) -> dict[str, str]:
    """The headers of a new User, accepted by a test scheme on the gateway."""
    if not any(isinstance(scheme, BearerTestScheme) for scheme in gateway.auth_schemes):
        gateway.auth_schemes.append(BearerTestScheme(gateway.store))
    async with gateway.store.transaction() as conn:
        admitted = await users.admit(conn)
    return {"Authorization": f"Bearer test-{admitted.id}"}


async def send(public: httpx.AsyncClient, headers: dict[str, str], text: str) -> dict[str, Any]:
    response = await public.post("/messages", json={"text": text}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def receipt_of(public: httpx.AsyncClient, headers: dict[str, str], seq: int, runs: int = 1) -> dict[str, Any]:
    """The receipt of Message ``seq`` once ``runs`` of its Runs started."""
    answers: list[dict[str, Any]] = []

    async def ready() -> bool:
        response = await public.get(f"/messages/{seq}/receipt", headers=headers)
        assert response.status_code == 200, response.text
        answers.append(response.json())
        return len(answers[-1]["runs"]) >= runs

    await until(ready)
    return answers[-1]


def written(tmp_path: Path, document: Any, name: str = "receipt.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


@pytest.fixture
async def gateway(make_gateway: GatewayFactory) -> Gateway:
    return await make_gateway(Recording(), handlers=HANDLERS)


@pytest.fixture
async def public(gateway: Gateway) -> Any:
    transport = httpx.ASGITransport(app=gateway.public_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
        yield client


async def test_a_receipt_verifies_for_its_text_and_refuses_another(
    gateway: Gateway, public: httpx.AsyncClient, tmp_path: Path
) -> None:
    alice, bob = await user(gateway), await user(gateway)
    message = await send(public, alice, TEXT)
    document = await receipt_of(public, alice, message["seq"])
    # The receipt: the Message without its text, its Signal, one Run under instructions #1, the checkpoint.
    assert document["message"] == {k: v for k, v in message.items() if k != "text"}
    assert TEXT not in json.dumps(document)
    assert document["signal"]["kind"] == "message.received"
    [run], [told] = document["runs"], document["instructions"]
    assert (told["seq"], told["kind"], run["kind"]) == (1, "instructions", "run")
    size = int(document["checkpoint"].split("\n")[1])
    assert run["treeSize"] == told["treeSize"] == size and run["seq"] <= size
    path = written(tmp_path, document)
    alice_id, bob_id = (headers["Authorization"].removeprefix("Bearer test-") for headers in (alice, bob))
    ok = f"your Message reached the agent as written, under instructions #1 (Message 1 of User {alice_id})"
    assert verify_receipt(path, TEXT, vkey(gateway)) == (0, ok)
    assert verify_receipt(path, TEXT, vkey(gateway), "--user", alice_id, "--seq", "1") == (0, ok)
    verified = receipt.verify(receipt.parse(path.read_bytes()), TEXT, proof.gateway_key(vkey(gateway)))
    assert (verified.seq, verified.user, verified.instructions, verified.runs) == (message["seq"], alice_id, [1], 1)
    # One character changed, and Bob's own text in Alice's receipt: refused, naming the text.
    for text in (TEXT.replace("10:00", "10:01"), TEXT + " ", "Bob's own words"):
        code, said = verify_receipt(path, text, vkey(gateway))
        assert code == 1 and "text: Message 1 as the agent was given it is not this text" in said, said
    # Bob's Message in Alice's receipt, and Alice's Message claimed as Bob's: refused.
    bobs = await send(public, bob, "Bob's own words")
    assert verify_receipt(path, "Bob's own words", vkey(gateway))[0] == 1
    claimed = copy.deepcopy(document)
    claimed["message"]["userId"] = (await public.get(f"/messages/{bobs['seq']}/receipt", headers=bob)).json()["message"]["userId"]
    code, said = verify_receipt(written(tmp_path, claimed, "claimed.json"), TEXT, vkey(gateway))
    assert code == 1 and said.startswith("agent-gateway: error: text:"), said
    # Bob writes Alice's very text: her receipt, handed to him, verifies for it, and names her; with --user, refused.
    code, said = verify_receipt(path, TEXT, vkey(gateway), "--user", bob_id)
    assert (code, said) == (1, f"agent-gateway: error: message: the receipt is of User {alice_id}'s Message, not --user {bob_id}'s")


async def test_another_users_message_is_the_same_404_as_none(gateway: Gateway, public: httpx.AsyncClient) -> None:
    alice, bob = await user(gateway), await user(gateway)
    message = await send(public, alice, TEXT)
    # Bob's log has no Message 1 or 2 yet; Alice's Message 1 is not his.
    for path in (f"/messages/{message['seq']}/receipt", "/messages/2/receipt", "/messages/999/receipt"):
        for headers in ((bob,) if path.startswith("/messages/1/") else (alice, bob)):
            response = await public.get(path, headers=headers)
            await assert_error(response, 404)
            assert response.json()["message"] == "No Message of yours has this seq."
    await assert_error(await public.get(f"/messages/{message['seq']}/receipt"), 401)
    await assert_error(await public.get("/messages/0/receipt", headers=alice), 400)
    await assert_error(await public.get("/messages/x/receipt", headers=alice), 400)
    await assert_error(await public.get(f"/messages/{message['seq']}/receipt?x=1", headers=alice), 400)


async def test_an_outbound_message_has_no_receipt(gateway: Gateway, public: httpx.AsyncClient) -> None:
    alice = await user(gateway)
    user_id = alice["Authorization"].removeprefix("Bearer test-")
    answer = await gateway.messages.send(user_id, "the agent's answer")
    response = await public.get(f"/messages/{answer.seq}/receipt", headers=alice)
    await assert_error(response, 404)
    assert response.json()["message"] == f"Message {answer.seq} is the agent's (outbound): only your inbound Messages have a receipt"


async def test_a_message_whose_signal_was_pruned_has_no_receipt(gateway: Gateway, public: httpx.AsyncClient) -> None:
    alice = await user(gateway)
    message = await send(public, alice, TEXT)
    await receipt_of(public, alice, message["seq"])
    path = f"/messages/{message['seq']}/receipt"

    async def pruned() -> bool:
        await retention.prune_signals(gateway.store, timedelta(0))
        return (await public.get(path, headers=alice)).status_code == 404

    await until(pruned)
    response = await public.get(path, headers=alice)
    await assert_error(response, 404)
    assert response.json()["message"] == f"Message {message['seq']}'s Signal was pruned (signals.retention): its receipt can no longer be made"


async def test_before_its_run_starts_a_receipt_has_no_run(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway(Recording(), handlers=HANDLERS)
    await gateway.stop_worker()
    transport = httpx.ASGITransport(app=gateway.public_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as public:
        alice = await user(gateway)
        message = await send(public, alice, TEXT)
        document = await receipt_of(public, alice, message["seq"], runs=0)
    assert (document["runs"], document["instructions"]) == ([], [])
    code, said = verify_receipt(written(tmp_path, document), TEXT, vkey(gateway))
    assert code == 1 and "no Run: Message 1 has not reached the agent yet" in said, said


async def test_a_template_changed_after_the_fact_is_refused(gateway: Gateway, public: httpx.AsyncClient, tmp_path: Path) -> None:
    # The operator swaps the template behind the ledger's back: the Prompt is made with another
    # template than the one instructions #1 publish.
    gateway.handlers._by_kind["message.received"] = TemplateHandler("message.received", "Ignore this: {{ text }}", "user_{{ userId }}")
    alice = await user(gateway)
    message = await send(public, alice, TEXT)
    document = await receipt_of(public, alice, message["seq"])
    code, said = verify_receipt(written(tmp_path, document), TEXT, vkey(gateway))
    assert code == 1 and said.startswith("agent-gateway: error: prompt: the template of instructions #1 does not make"), said


async def test_tampered_receipts_are_refused_naming_the_check(
    gateway: Gateway, public: httpx.AsyncClient, tmp_path: Path
) -> None:
    alice = await user(gateway)
    message = await send(public, alice, TEXT)
    document = await receipt_of(public, alice, message["seq"])
    key = vkey(gateway)

    def refused(change: Any, expected: str, text: str = TEXT, key: str = key) -> None:
        changed = copy.deepcopy(document)
        change(changed)
        code, said = verify_receipt(written(tmp_path, changed, "changed.json"), text, key)
        assert code == 1 and said.startswith(f"agent-gateway: error: {expected}"), said

    def sign_flipped(d: dict[str, Any]) -> None:
        text, _, line = d["checkpoint"].rpartition("\n\n")
        name, signature = line.rstrip("\n").rsplit(" ", 1)
        raw = bytearray(base64.b64decode(signature))
        raw[-1] ^= 1
        d["checkpoint"] = f"{text}\n\n{name} {base64.b64encode(bytes(raw)).decode()}\n"

    def hash_flipped(d: dict[str, Any]) -> None:
        raw = bytearray(base64.b64decode(d["runs"][0]["hashes"][0]))
        raw[0] ^= 1
        d["runs"][0]["hashes"][0] = base64.b64encode(bytes(raw)).decode()

    def template_rewritten(d: dict[str, Any]) -> None:
        d["instructions"][0]["leaf"] = d["instructions"][0]["leaf"].replace("Message {{ seq }}", "Message {{seq}}")

    refused(sign_flipped, "checkpoint: the signature of")
    refused(hash_flipped, "inclusion: entry")
    refused(template_rewritten, "inclusion: entry 1 is not in the checkpoint's tree")
    refused(lambda d: d.update(instructions=[]), "instructions: Run")
    refused(lambda d: d["signal"].update(id="00000000-0000-4000-8000-000000000000"), "signal: Run")
    refused(lambda d: d["runs"][0].update(index=5), "inclusion: entry")
    refused(lambda d: d["runs"][0]["hashes"].__setitem__(0, "not base64!"), "inclusion: entry")
    # Another key under the gateway's name, another log's name, and a key that is no vkey.
    name = key.split("+")[0]
    other = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(other).rstrip(b"=").decode()}
    refused(lambda d: None, "checkpoint: ", key=note.note_keys(name, jwk)[0].vkey())
    refused(lambda d: None, "checkpoint: the note is another log's", key=note.note_keys("example.com/log", jwk)[0].vkey())
    refused(lambda d: None, "--key: not an Ed25519", key="nonsense")


class Quoting:
    """A Python Handler of Messages: its Prompts cannot be recomputed offline."""

    def handle(self, signal: Signal) -> list[Prompt]:
        return [Prompt(f"> {signal.payload['text']}")]


async def test_a_python_handlers_prompt_is_not_recomputed(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    gateway = await make_gateway(Recording(), register={"message.received": Quoting()})
    transport = httpx.ASGITransport(app=gateway.public_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as public:
        alice = await user(gateway)
        message = await send(public, alice, TEXT)
        document = await receipt_of(public, alice, message["seq"])
    path = written(tmp_path, document)
    # The text is checked (the payload digest), then the Prompt cannot be: refused, saying why.
    assert verify_receipt(path, TEXT + "!", vkey(gateway))[1].startswith("agent-gateway: error: text:")
    code, said = verify_receipt(path, TEXT, vkey(gateway))
    assert code == 1 and said.endswith("the Handler of message.received in instructions #1 is Python code: its Prompt cannot be recomputed offline"), said


@pytest.mark.parametrize("content", ["", "not json", "[]", '{"message": {}}', '{"message": 1, "signal": {}, "checkpoint": "", "runs": [], "instructions": []}'])
def test_a_malformed_receipt_is_one_line(tmp_path: Path, content: str) -> None:
    key = "agent-gateway/decisions/0123456789abcdef+01234567+AQ" + "A" * 43
    path = written(tmp_path, content)
    code, said = verify_receipt(path, TEXT, key)
    assert code == 1 and said.startswith("agent-gateway: error: format: not a receipt ("), said
    code, said = verify_receipt(tmp_path / "missing.json", TEXT, key)
    assert code == 1 and "No such file" in said, said
