"""``agent-gateway verify-receipt`` on receipts made here with a key of the test's own (no gateway): a
receipt proves one Message of one User, and is refused in one line when it is another User's or
another Message's, when its ledger is another log, when the Run names instructions published after
it, when its payload cannot be checked, and for files that would otherwise stop the command with a
traceback (a signature line that is not base64, a size of thousands of digits, a template nested
beyond Python's recursion limit)."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import OKPKey
from typer.testing import CliRunner

from agent_gateway.cli.main import app
from agent_gateway.ledger import entries
from agent_gateway.transparency import note
from tests.test_merkle import mth, path

KEY = OKPKey.generate_key("Ed25519")
DECISIONS = "agent-gateway/decisions/0123456789abcdef"
LEDGER = "agent-gateway/ledger/0123456789abcdef"
VKEY = note.NoteSigner(DECISIONS, KEY, "EdDSA").key.vkey()
TEMPLATE = "A message from user {{ userId }}:\n\n{{ text }}"
SESSION = "user_{{ userId }}"
ALICE, BOB = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
TEXT = "yes, book it"


def message(user: str, seq: int) -> dict[str, Any]:
    return {"id": f"a0000000-0000-4000-8000-{seq:012d}", "userId": user, "direction": "inbound", "seq": seq,
            "createdAt": "2026-01-01T00:00:00.000Z"}


def signal(number: int) -> dict[str, str]:
    return {"id": f"5a000000-0000-4000-8000-{number:012d}", "kind": "message.received", "emittedAt": "2026-01-01T00:00:00.500Z"}


def instructions(template: str = TEMPLATE) -> bytes:
    return entries.instructions({"handlers": [{"kind": "message.received", "template": template, "session": SESSION}]},
                                "2026-01-01T00:00:00.000Z")


def run(message: dict[str, Any], signal: dict[str, str], told: int, text: str = TEXT, prompt: str | None = None) -> bytes:
    payload = {**message, "text": text}
    made = f"A message from user {message['userId']}:\n\n{text}" if prompt is None else prompt
    return entries.run(run_id=f"r{message['seq']}", signal_id=signal["id"], kind=signal["kind"], origin="message",
                       session=f"user_{message['userId']}", prompt=made, payload=payload, instructions_seq=told,
                       started_at="2026-01-01T00:00:01.000Z")


def receipt(leaves: list[bytes], message: dict[str, Any], signal: dict[str, str], runs: list[int], told: list[int],
            origin: str = LEDGER, size: str | None = None) -> dict[str, Any]:
    """The receipt of ``message``: entries ``runs`` and ``told`` (numbers from 1) of a ledger of ``leaves``."""
    root = mth(leaves)
    text = f"{origin}\n{size or len(leaves)}\n{base64.b64encode(root).decode()}\n".encode()

    def proved(seq: int) -> dict[str, Any]:
        leaf = leaves[seq - 1]
        return {"seq": seq, "index": seq - 1, "kind": json.loads(leaf)["type"], "leaf": leaf.decode(),
                "treeSize": len(leaves), "hashes": [base64.b64encode(h).decode() for h in path(seq - 1, leaves)]}

    return {"message": message, "signal": signal, "checkpoint": note.NoteSigner(origin, KEY, "EdDSA").sign(text).decode(),
            "runs": [proved(seq) for seq in runs], "instructions": [proved(seq) for seq in told]}


ALICES, BOBS = message(ALICE, 3), message(BOB, 7)
LEAVES = [instructions(), run(ALICES, signal(1), 1), run(BOBS, signal(2), 1, text=TEXT)]
ALICE_RECEIPT = receipt(LEAVES, ALICES, signal(1), [2], [1])


def verify_receipt(tmp_path: Path, document: Any, *args: str, text: str = TEXT, key: str = VKEY) -> tuple[int, str]:
    """The command's exit code and its one line (stdout or stderr; never two lines, never a traceback)."""
    file = tmp_path / "receipt.json"
    file.write_text(document if isinstance(document, str) else json.dumps(document))
    result = CliRunner().invoke(app, ["verify-receipt", str(file), "--text", text, "--key", key, *args])
    output = (result.stdout + (result.stderr or "")).strip()
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "\n" not in output and "Traceback" not in output, output
    return result.exit_code, output


def test_the_line_names_the_message_and_its_user_and_user_and_seq_pin_them(tmp_path: Path) -> None:
    assert verify_receipt(tmp_path, ALICE_RECEIPT) == (
        0, f"your Message reached the agent as written, under instructions #1 (Message 3 of User {ALICE})"
    )
    assert verify_receipt(tmp_path, ALICE_RECEIPT, "--user", ALICE, "--seq", "3")[0] == 0
    assert verify_receipt(tmp_path, ALICE_RECEIPT, "--user", ALICE.upper())[0] == 0  # a UUID in capitals is the same id
    # Bob wrote the same text: Alice's receipt, handed to him, is not his.
    code, said = verify_receipt(tmp_path, ALICE_RECEIPT, "--user", BOB)
    assert (code, said) == (1, f"agent-gateway: error: message: the receipt is of User {ALICE}'s Message, not --user {BOB}'s")
    code, said = verify_receipt(tmp_path, ALICE_RECEIPT, "--user", ALICE, "--seq", "4")
    assert (code, said) == (1, "agent-gateway: error: message: the receipt is of Message 3, not --seq 4")
    assert verify_receipt(tmp_path, ALICE_RECEIPT, "--user", "bob")[1] == "agent-gateway: error: --user must be a UUID"


def test_a_checkpoint_of_another_log_is_refused(tmp_path: Path) -> None:
    # The ledger's tree signed under the Decision log's origin: the key verifies, the log is not the ledger.
    code, said = verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], origin=DECISIONS))
    assert code == 1 and said.startswith("agent-gateway: error: checkpoint: the note is another log's"), said
    assert verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], origin="example.com/log"))[0] == 1
    # The configured-origin form (transparency.origin + /ledger) is the ledger's too.
    assert verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], origin=DECISIONS + "/ledger"))[0] == 0
    # The ledger's own vkey (keys show: ledger.vkey) names the ledger itself, and the Decision log's is refused under it.
    for origin in (LEDGER, "example.com/log/ledger"):
        ledger_vkey = note.NoteSigner(origin, KEY, "EdDSA").key.vkey()
        assert verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], origin=origin), key=ledger_vkey)[0] == 0
    code, said = verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], origin=DECISIONS), key=ledger_vkey)
    assert code == 1 and said.startswith("agent-gateway: error: checkpoint: the note is another log's"), said


def test_instructions_published_after_the_run_are_refused(tmp_path: Path) -> None:
    # The Run (entry 1) names instructions #2, appended after it: not what it ran under.
    leaves = [run(ALICES, signal(1), 2), instructions()]
    code, said = verify_receipt(tmp_path, receipt(leaves, ALICES, signal(1), [1], [2]))
    assert code == 1 and said.startswith("agent-gateway: error: instructions: Run r3 (entry 1) names instructions #2"), said
    assert "after it" in said


def test_a_payload_that_cannot_be_checked_is_refused(tmp_path: Path) -> None:
    # The Run's entry records no payload digest (null) and the receipt's Message is no JSON the
    # gateway could hash (an integer beyond 2**53): nothing ties the text to the Run.
    odd = {**ALICES, "x": 2**60}
    template = "{{ userId }}: {{ text[:3] }}"
    leaf = json.loads(run(odd, signal(1), 1, prompt=f"{ALICE}: yes"))
    leaf["payload"] = None
    leaves = [instructions(template), entries.canonical(leaf)]
    code, said = verify_receipt(tmp_path, receipt(leaves, odd, signal(1), [2], [1]))
    assert code == 1 and said.startswith("agent-gateway: error: text: "), said
    # A Message the gateway can hash, with a null digest in the Run's entry: refused as well.
    leaf = json.loads(run(ALICES, signal(1), 1))
    leaf["payload"] = None
    code, said = verify_receipt(tmp_path, receipt([instructions(), entries.canonical(leaf)], ALICES, signal(1), [2], [1]))
    assert code == 1 and said.startswith("agent-gateway: error: text: ") and "no payload digest" in said, said


def test_files_that_raised_a_traceback_are_one_line(tmp_path: Path) -> None:
    # A signature line whose base64 is not padded (of a key nobody knows): the note is malformed.
    unpadded = copy.deepcopy(ALICE_RECEIPT)
    unpadded["checkpoint"] = ALICE_RECEIPT["checkpoint"] + "\u2014 someone AAAAA\n"
    code, said = verify_receipt(tmp_path, unpadded)
    assert code == 1 and said.startswith("agent-gateway: error: checkpoint: malformed signature line"), said
    # A size of 5,000 digits (beyond Python's conversion limit, and 2**64).
    code, said = verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], size="9" * 5000))
    assert code == 1 and said.startswith("agent-gateway: error: checkpoint: the checkpoint's size") and len(said) < 300, said
    code, said = verify_receipt(tmp_path, receipt(LEAVES, ALICES, signal(1), [2], [1], size=str(2**64)))
    assert code == 1 and "checkpoint's size" in said, said
    # A published template nested deeper than Python's recursion limit.
    deep = "{{" + "(" * 3000 + "text" + ")" * 3000 + "}}"
    leaves = [instructions(deep), run(ALICES, signal(1), 1, prompt="whatever")]
    code, said = verify_receipt(tmp_path, receipt(leaves, ALICES, signal(1), [2], [1]))
    assert code == 1 and said.startswith("agent-gateway: error: prompt: the template of message.received in instructions #1"), said


@pytest.mark.parametrize(("field", "value"), [("seq", 2), ("index", 1)])
def test_a_number_of_thousands_of_digits_is_one_line(tmp_path: Path, field: str, value: int) -> None:
    raw = json.dumps(ALICE_RECEIPT).replace(f'"{field}": {value},', f'"{field}": {"9" * 5000},', 1)
    assert raw != json.dumps(ALICE_RECEIPT)
    code, said = verify_receipt(tmp_path, raw)
    assert code == 1 and said.startswith("agent-gateway: error: format: not a receipt"), said


# --- the chat page's check (web/static/verify.js), the same receipts, under Node ------------------

VERIFY_JS = Path(__file__).parents[2] / "src" / "agent_gateway" / "web" / "static" / "verify.js"
# verify.js as the page loads it (window.agentGatewayProofs), then verifyReceipt on the case in argv[1]:
# prints what it checked, or "refused: " and the Refused error's message.
NODE_SCRIPT = """
globalThis.window = globalThis;
const fs = require("fs");
require("vm").runInThisContext(fs.readFileSync(process.argv[2], "utf8"));
const { receipt, message, jwks } = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
window.agentGatewayProofs.verifyReceipt(receipt, message, jwks).then(
  (checked) => console.log("ok " + checked.instructions.map((entry) => entry.seq).join(",")),
  (error) => console.log((error instanceof window.agentGatewayProofs.Refused ? "refused: " : "threw: ") + error.message),
);
"""


def in_the_page(tmp_path: Path, document: dict[str, Any], user: str = ALICE, seq: int = 3) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node: the chat page's code is checked by tests/web in Chromium")
    case = tmp_path / "case.json"
    jwks = {"keys": [KEY.as_dict(private=False)]}
    case.write_text(json.dumps({"receipt": document, "message": {"seq": seq, "text": TEXT, "userId": user}, "jwks": jwks}))
    script = tmp_path / "check.js"
    script.write_text(NODE_SCRIPT)
    command = [node, str(script), str(VERIFY_JS), str(case)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.processes
def test_the_chat_page_checks_the_user_the_order_and_the_signature_lines_as_the_command_does(tmp_path: Path) -> None:
    assert in_the_page(tmp_path, ALICE_RECEIPT) == "ok 1"
    # Bob, logged in, shown Alice's receipt for his Message 3 of the same text.
    assert in_the_page(tmp_path, ALICE_RECEIPT, user=BOB) == "refused: the receipt is of another User's Message"
    leaves = [run(ALICES, signal(1), 2), instructions()]
    later = receipt(leaves, ALICES, signal(1), [1], [2])
    assert in_the_page(tmp_path, later) == "refused: instructions #2 were appended after the Run"
    unpadded = {**ALICE_RECEIPT, "checkpoint": ALICE_RECEIPT["checkpoint"] + "\u2014 someone AAAAA\n"}
    assert in_the_page(tmp_path, unpadded) == "refused: a signature line of the checkpoint is malformed"
    body = ALICE_RECEIPT["checkpoint"].split("\n")
    assert in_the_page(tmp_path, {**ALICE_RECEIPT, "checkpoint": "\n".join([*body[:2], "A", *body[3:]])}) == (
        "refused: the checkpoint's root hash is not base64"
    )
