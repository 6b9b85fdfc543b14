"""The offline verifiers (``verify-proof``, ``audit``) on inputs made here, no gateway: a malformed
signature line, a size or index of thousands of digits and a signed note that is no checkpoint are
one line, never a traceback; a witness given twice (or its key under two names) is refused, and
counts once in the checks themselves; a quorum that two verifiers could meet with disjoint
witnesses is warned about; a first audit takes only the audited log's origin."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from typer.testing import CliRunner

from agent_gateway.cli.main import app
from agent_gateway.signatures import keys, verifier
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.transparency import audit as audits
from agent_gateway.transparency import note, proof, witness
from tests.test_merkle import mth, subproof
from tests.transparency.test_witness import cosign, vkey

IDENTITY = SigningIdentity(keys.generate_pem("ed25519"))
JWKS = verifier.parse_jwk_set(IDENTITY.jwks())
_SPKI = IDENTITY.key.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
FINGERPRINT = hashlib.sha256(_SPKI).hexdigest()[:16]
DECISIONS = "agent-gateway/decisions/" + FINGERPRINT
LEDGER = "agent-gateway/ledger/" + FINGERPRINT
GATEWAY = note.NoteSigner(DECISIONS, IDENTITY.key, IDENTITY.algorithm)
WITNESSES = [ed25519.Ed25519PrivateKey.generate() for _ in range(4)]
WITNESS_NAMES = [f"w{number}.example/w" for number in range(1, 5)]


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


WITNESS_VKEYS = [vkey(name, raw(key)) for name, key in zip(WITNESS_NAMES, WITNESSES)]


def signed(origin: str, leaves: list[bytes], size: str | None = None) -> bytes:
    """The checkpoint of ``leaves`` under ``origin``, signed by the gateway's key."""
    text = f"{origin}\n{size or len(leaves)}\n{base64.b64encode(mth(leaves)).decode()}\n".encode()
    return note.NoteSigner(origin, IDENTITY.key, IDENTITY.algorithm).sign(text)


def decision(seq: int) -> dict[str, Any]:
    record = {"seq": seq, "createdAt": "2026-01-01T00:00:00.000Z", "statement": f"decided {seq}"}
    return {**record, "jws": IDENTITY.sign(orjson.dumps(record), DECISION_TYP)}


def served(
    checkpoint: bytes, records: list[dict[str, Any]], leaves: list[bytes], prefix: str = "", member: str = "decisions",
    witnessed: bytes | None = None,
) -> httpx.Client:
    """A log as a gateway serves it, in memory: its checkpoint, consistency proofs, entries and witnessed checkpoint."""

    def handle(request: httpx.Request) -> httpx.Response:
        where, params = request.url.path, request.url.params
        if where == f"{prefix}/checkpoint":
            return httpx.Response(200, content=checkpoint)
        if where == f"{prefix}/checkpoint/witnessed":
            return httpx.Response(200, content=witnessed) if witnessed else httpx.Response(404)
        if where == f"{prefix}/checkpoint/consistency":
            hashes = subproof(int(params["from"]), leaves[: int(params["to"])], True)
            return httpx.Response(200, json={"hashes": [base64.b64encode(hash_).decode() for hash_ in hashes]})
        if where == f"{prefix}/{member}":
            after, limit = int(params["after"]), int(params["limit"])
            return httpx.Response(200, json={member: [r for r in records if r["seq"] > after][:limit]})
        return httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(handle), base_url="http://gateway")


def audit_decisions(client: httpx.Client, *witnesses: witness.WitnessKey, quorum: int = 0) -> audits.State:
    return audits.Auditor(client, JWKS, list(witnesses), quorum).audit(audits.State())[0]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout.strip(), (result.stderr or "").strip()


# --- the signed note ---------------------------------------------------------------------


def test_a_signature_line_that_is_not_base64_makes_the_note_malformed_whoever_its_key() -> None:
    good = signed(DECISIONS, [b"a"])
    for line in ("AAAAA", "AAA", "AA=A", "A===", "AAAAAA="):
        with pytest.raises(note.NoteError, match="malformed signature line"):
            note.open_note(good + f"\u2014 stranger.example/x {line}\n".encode(), [GATEWAY.key])
    # signed-note: a signature is a key ID and at least one byte; shorter, the line is malformed.
    with pytest.raises(note.NoteError, match="malformed signature line"):
        note.open_note(good + "\u2014 stranger.example/x AAAAAA==\n".encode(), [GATEWAY.key])
    # A well-formed line of a key nobody asked about is ignored, as signed-note says.
    stranger = "\u2014 stranger.example/x " + base64.b64encode(bytes(40)).decode() + "\n"
    assert note.open_note(good + stranger.encode(), [GATEWAY.key]) == good[: good.index(b"\n\n") + 1]


def test_a_size_of_thousands_of_digits_is_refused_in_one_short_line() -> None:
    root = base64.b64encode(bytes(32)).decode()
    for size in ("9" * 5000, str(2**64), "1" * 21):
        with pytest.raises(note.NoteError, match="the checkpoint's size") as caught:
            note.Checkpoint.parse(f"{DECISIONS}\n{size}\n{root}\n".encode())
        assert len(str(caught.value)) < 200
    assert note.Checkpoint.parse(f"{DECISIONS}\n{2**64 - 1}\n{root}\n".encode()).size == 2**64 - 1
    with pytest.raises(note.NoteError):
        note.Checkpoint.parse(b"\xff\n1\n" + root.encode() + b"\n")


# --- verify-proof --------------------------------------------------------------------------


def a_proof(witnesses: list[int] = [0, 1], names: list[str] | None = None) -> bytes:  # noqa: B006
    """A proof of Decision 1, the only one of the log, cosigned by ``witnesses``."""
    record = decision(1)
    leaf = record["jws"].encode()
    note_ = signed(DECISIONS, [leaf])
    text = note_[: note_.index(b"\n\n") + 1]
    lines = b"".join(cosign(text, name=(names or WITNESS_NAMES)[i], key=WITNESSES[i]) for i in witnesses)
    return proof.TlogProof(leaf, 0, [], note_ + lines).render()


def verify_proof(tmp_path: Path, data: bytes, *args: str) -> tuple[int, str, str]:
    file = tmp_path / "decision.tlog-proof"
    file.write_bytes(data)
    return run("verify-proof", str(file), "--key", GATEWAY.key.vkey(), *args)


def test_verify_proof_answers_one_line_for_what_raised_a_traceback(tmp_path: Path) -> None:
    good = a_proof()
    assert verify_proof(tmp_path, good)[0] == 0
    code, out, err = verify_proof(tmp_path, good + "\u2014 stranger.example/x AAA\n".encode())
    assert (code, out) == (1, "") and err.startswith("agent-gateway: error: checkpoint: malformed signature line"), err
    # An index of 5,000 digits, and one beyond 2**64.
    for index in ("1" * 5000, str(2**64)):
        code, out, err = verify_proof(tmp_path, good.replace(b"\nindex 0\n", f"\nindex {index}\n".encode()))
        assert code == 1 and err.startswith("agent-gateway: error: format: ") and len(err) < 200, err
    # A note the gateway's key signs that is no checkpoint.
    not_a_checkpoint = proof.TlogProof(b"x", 0, [], GATEWAY.sign(f"{DECISIONS}\nx\nAAAA\n".encode())).render()
    code, out, err = verify_proof(tmp_path, not_a_checkpoint)
    assert code == 1 and err.startswith("agent-gateway: error: checkpoint: the checkpoint's size"), err


def test_a_witness_given_twice_is_refused_and_counts_once(tmp_path: Path) -> None:
    data = a_proof()
    code, _, err = verify_proof(tmp_path, data, "--witness", WITNESS_VKEYS[0], "--witness", WITNESS_VKEYS[0])
    twice = "agent-gateway: error: --witness #2: the same witness key as --witness #1 (list each witness once)"
    assert (code, err) == (1, twice)
    # Its key under another name: cosignature/v1 does not sign the name, so it is the same witness.
    alias = vkey("alias.example/w", raw(WITNESSES[0]))
    code, _, err = verify_proof(tmp_path, data, "--witness", WITNESS_VKEYS[0], "--witness", alias)
    assert (code, err) == (1, twice)
    # The library counts one key once too: its one cosignature, copied under the alias, is one of two.
    aliased = a_proof([0, 0], names=[WITNESS_NAMES[0], "alias.example/w"])
    keys_ = [witness.WitnessKey.parse(WITNESS_VKEYS[0]), witness.WitnessKey.parse(alias)]
    with pytest.raises(proof.ProofFailure, match="cosignatures: 1 of the given witnesses cosigned, --quorum is 2"):
        proof.verify(proof.TlogProof.parse(aliased), GATEWAY.key, keys_, 2)
    # The same for an audit, before it reads anything of the network.
    code, _, err = run("audit", "http://127.0.0.1:9", "--witness", WITNESS_VKEYS[1], "--witness", WITNESS_VKEYS[1])
    assert code == 1 and err.startswith("agent-gateway: error: --witness #2: the same witness key as --witness #1"), err
    checkpoint = signed(DECISIONS, [])
    text = checkpoint[: checkpoint.index(b"\n\n") + 1]
    twice = cosign(text, name=WITNESS_NAMES[0], key=WITNESSES[0]) + cosign(text, name="alias.example/w", key=WITNESSES[0])
    witnessed = checkpoint + twice
    with pytest.raises(audits.AuditFailure, match="1 of the given witnesses cosigned it, --quorum is 2"):
        audit_decisions(served(checkpoint, [], [], witnessed=witnessed), *keys_, quorum=2)


@pytest.mark.parametrize(
    ("given", "quorum", "warned"),
    [(2, "1", True), (4, "2", True), (3, "2", False), (2, None, False), (1, "0", True), (4, "3", False)],
)
def test_a_quorum_of_half_the_witnesses_or_fewer_is_warned_about(tmp_path: Path, given: int, quorum: str | None, warned: bool) -> None:
    args = [arg for vkey_ in WITNESS_VKEYS[:given] for arg in ("--witness", vkey_)] + (["--quorum", quorum] if quorum else [])
    code, out, err = verify_proof(tmp_path, a_proof(list(range(given))), *args)
    assert code == 0 and out.startswith("ok: Decision 1 is in ") and "\n" not in out, (out, err)
    if warned:
        assert err == (
            f"agent-gateway: warning: --quorum {quorum} of {given} witnesses: two verifiers could each be shown their own "
            f"log, cosigned by witnesses the other did not count; ask for more than half ({given // 2 + 1})"
        )
    else:
        assert err == ""


# --- audit ---------------------------------------------------------------------------------


def test_audit_refuses_a_malformed_signature_line_in_one_line() -> None:
    checkpoint = signed(DECISIONS, []) + "\u2014 stranger.example/x AAA\n".encode()
    with pytest.raises(audits.AuditFailure, match="the checkpoint does not verify against the JWK Set: malformed signature line"):
        audit_decisions(served(checkpoint, [], []))
    witnessed = signed(DECISIONS, []) + "\u2014 stranger.example/x AAA\n".encode()
    with pytest.raises(audits.AuditFailure, match="the witnessed checkpoint does not verify .*: malformed signature line"):
        audit_decisions(served(signed(DECISIONS, []), [], [], witnessed=witnessed), witness.WitnessKey.parse(WITNESS_VKEYS[0]), quorum=1)


def test_a_first_audit_of_the_decision_log_refuses_the_ledgers_checkpoint() -> None:
    with pytest.raises(audits.AuditFailure, match=f"the checkpoint names the log '{LEDGER}': the Run ledger's, not the Decision log"):
        audit_decisions(served(signed(LEDGER, []), [], []))
    assert audit_decisions(served(signed("example.com/log", []), [], [])).origin == "example.com/log"


def test_the_decision_log_may_skip_numbers() -> None:
    # The spec: a rolled-back publish burns a number; gaps mean nothing. The leaves are in seq order.
    records = [decision(seq) for seq in (1, 3, 4, 9)]
    leaves = [record["jws"].encode() for record in records]
    state = audit_decisions(served(signed(DECISIONS, leaves), records, leaves))
    assert (state.size, state.last_seq) == (4, 9)
    # Out of order is refused still.
    shuffled = [records[1], records[0], *records[2:]]
    with pytest.raises(audits.AuditFailure, match="out of order"):
        audit_decisions(served(signed(DECISIONS, leaves), shuffled, leaves))


def remembered(state: audits.State) -> dict[str, Any]:
    return json.loads(json.dumps(state.to_json()))


def test_a_decision_log_state_lists_no_instructions() -> None:
    assert "instructions" not in remembered(audit_decisions(served(signed(DECISIONS, []), [], [])))

