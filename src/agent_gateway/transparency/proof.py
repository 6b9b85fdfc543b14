"""Offline proofs of one Decision (c2sp.org/tlog-proof@v1), and their verification with no network.

The proof holds the Decision's leaf index, its RFC 9162 inclusion proof, and the witnessed checkpoint
(the gateway's signature and the witnesses' cosignatures); the spec leaves the leaf to the
application: here ``extra`` is the base64 of the Decision's JWS, which is the leaf's data, so a
verifier hashes it into the tree and also checks it, and reads the statement from it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re

from agent_gateway import errors, merkle
from agent_gateway.signatures import verifier
from agent_gateway.transparency import note, witness

HEADER = b"c2sp.org/tlog-proof@v1"
MEDIA_TYPE = "text/plain; charset=utf-8"
_ED25519_VKEY = re.compile(r"([^\s+]+)\+([0-9a-f]{8})\+([A-Za-z0-9+/]+={0,2})")


class ProofFailure(errors.GatewayError):
    """The proof does not prove what it says; the message names the check (and the key)."""


@dataclasses.dataclass(frozen=True)
class TlogProof:
    extra: bytes
    index: int
    hashes: list[bytes]
    note: bytes  # the checkpoint note, verbatim: its signature and cosignature lines included

    def render(self) -> bytes:
        lines = [HEADER, b"extra " + base64.b64encode(self.extra), b"index %d" % self.index]
        lines += [base64.b64encode(hash_) for hash_ in self.hashes]
        return b"\n".join(lines) + b"\n\n" + self.note

    @classmethod
    def parse(cls, data: bytes) -> TlogProof:
        head, blank, signed = data.partition(b"\n\n")
        lines = head.split(b"\n")
        if not blank or lines[0] != HEADER:
            raise ProofFailure("format: not a c2sp.org/tlog-proof@v1 proof")
        if len(lines) < 3 or not lines[1].startswith(b"extra "):
            raise ProofFailure("format: no extra line (the Decision's JWS)")
        if not lines[2].startswith(b"index "):
            raise ProofFailure("format: no index line")
        # A leaf index is below a tree size, so below 2^64: 20 digits at most, never thousands for int() to refuse.
        match = re.fullmatch(rb"index (0|[1-9][0-9]{0,19})", lines[2])
        if match is None or int(match.group(1)) > note.MAX_SIZE:
            raise ProofFailure("format: the index is not a decimal number below 2^64")
        try:
            extra = base64.b64decode(lines[1][6:], validate=True)
            hashes = [base64.b64decode(line, validate=True) for line in lines[3:]]
        except binascii.Error:
            raise ProofFailure("format: a line is not base64") from None
        return cls(extra, int(match.group(1)), hashes, signed)


def gateway_key(vkey: str) -> note.NoteKey:
    """The gateway's checkpoint key from its verifier key (``agent-gateway keys show``'s ``vkey``): an
    Ed25519 signed-note key (type 0x01), the only kind witnesses take. Raises :class:`ProofFailure`."""
    match = _ED25519_VKEY.fullmatch(vkey)
    try:
        blob = base64.b64decode(match.group(3), validate=True) if match else b""
    except binascii.Error:
        blob = b""
    if match is None or blob[:1] != note.ED25519 or len(blob) != 33:
        raise ProofFailure("--key: not an Ed25519 signed-note verifier key (name+key ID+base64)")
    x = base64.urlsafe_b64encode(blob[1:]).rstrip(b"=").decode()
    [key] = note.note_keys(match.group(1), {"kty": "OKP", "crv": "Ed25519", "x": x})
    if key.key_id.hex() != match.group(2):
        raise ProofFailure("--key: its key ID does not match its name and key")
    return key


def cosigners(witnesses: list[witness.WitnessKey], text: bytes, lines: bytes) -> list[witness.WitnessKey]:
    """The keys of ``witnesses`` whose cosignature of the checkpoint ``text`` is among the signature
    ``lines``, each public key once: cosignature/v1 signs the checkpoint, not the witness's name, so
    one cosignature copied under a second name would otherwise count twice. Raises :class:`note.NoteError`."""
    found: dict[bytes, witness.WitnessKey] = {}
    for key in witnesses:
        if key.public not in found and witness.cosignature_of(key, text, lines) is not None:
            found[key.public] = key
    return list(found.values())


@dataclasses.dataclass(frozen=True)
class Verified:
    seq: int
    statement: str
    checkpoint: note.Checkpoint
    cosigned_by: list[str]  # the names of the given witnesses whose cosignatures verified


def verify(
    proof: TlogProof, gateway: note.NoteKey, witnesses: list[witness.WitnessKey], quorum: int, statement: str | None = None
) -> Verified:
    """Check ``proof`` with no network: the gateway's signature of the checkpoint, the leaf into its
    root, at least ``quorum`` of ``witnesses``' cosignatures, the JWS under the gateway's key and,
    given ``statement``, that the Decision says it. Raises :class:`ProofFailure` naming the failing check."""
    try:
        text = note.open_note(proof.note, [gateway])
        checkpoint = note.Checkpoint.parse(text)
    except note.NoteError as exc:
        raise ProofFailure(f"checkpoint: {exc} (--key {gateway.name})") from None
    if checkpoint.origin != gateway.name:
        raise ProofFailure(f"checkpoint: its origin {checkpoint.origin!r} is not --key's name {gateway.name!r}")
    try:
        merkle.verify_inclusion(proof.index, checkpoint.size, merkle.leaf_hash(proof.extra), proof.hashes, checkpoint.root)
    except merkle.ProofError as exc:
        raise ProofFailure(f"inclusion: {exc}") from None
    try:
        cosigned = cosigners(witnesses, text, proof.note[len(text) + 1 :])
    except note.NoteError as exc:
        raise ProofFailure(f"cosignatures: {exc}") from None
    if len(cosigned) < quorum:
        missing = [key.name for key in witnesses if key.public not in {found.public for found in cosigned}]
        raise ProofFailure(
            f"cosignatures: {len(cosigned)} of the given witnesses cosigned, --quorum is {quorum}"
            + (f" (no valid cosignature by {', '.join(missing)})" if missing else "")
        )
    verified = verifier.verify(proof.extra.decode(errors="replace"), [gateway.key])
    if verified is None:
        raise ProofFailure(f"decision: the JWS in extra does not verify under --key {gateway.name}")
    payload = verified.payload
    said = payload.get("statement") if isinstance(payload, dict) else None
    if not isinstance(said, str) or not isinstance(payload.get("seq"), int):
        raise ProofFailure("decision: the JWS's payload is not a Decision")
    if statement is not None and said != statement:
        raise ProofFailure(f"statement: Decision {payload['seq']} says something else")
    return Verified(payload["seq"], said, checkpoint, [key.name for key in cosigned])
