"""Witnesses, as protocol: cosignatures (c2sp.org/tlog-cosignature, Ed25519 cosignature/v1) and the
add-checkpoint exchange (c2sp.org/tlog-witness). Pure: no I/O, no clock of its own.

A witness is known by its verifier key (signed-note "vkey"): ``name+hex key ID+base64(0x04 ||
32-byte Ed25519 public key)``. Its cosignature of a checkpoint is a signed-note signature line
under that name whose bytes are the key ID, an 8-byte big-endian POSIX timestamp and the Ed25519
signature of ``cosignature/v1\\ntime <timestamp>\\n`` followed by the checkpoint's note text.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway.transparency import note

COSIGNATURE_V1 = b"\x04"
# tlog-witness: at most 63 consistency proof lines in an add-checkpoint request.
MAX_PROOF_LINES = 63
SIZE_MEDIA_TYPE = "text/x.tlog.size"
# tlog-cosignature: a timestamp must not exceed 2^63 - 1.
MAX_TIMESTAMP = 2**63 - 1
# Tree sizes are 64-bit (tlog-checkpoint): a witness's size is read only below 2^64, 20 digits at most, so that a
# hostile one cannot make us convert a number of thousands of digits (which int() refuses with a ValueError).
MAX_SIZE = 2**64 - 1
_ED25519_SIZE = 32
_SIGNATURE_SIZE = 64
_VKEY = re.compile(r"([^\s+]+)\+([0-9a-f]{8})\+([A-Za-z0-9+/]+={0,2})")
_SIGNATURE_LINE = re.compile(r"\u2014 ([^\s+]+) ([A-Za-z0-9+/]+={0,2})")


@dataclasses.dataclass(frozen=True)
class Cosignature:
    """One witness's cosignature: which key (name, key ID), when, and the Ed25519 signature."""

    name: str
    key_id: bytes
    timestamp: int
    signature: bytes

    def line(self) -> bytes:
        """The signed-note signature line, with its newline."""
        blob = self.key_id + self.timestamp.to_bytes(8, "big") + self.signature
        return f"{note.SIGNATURE_PREFIX}{self.name} {base64.b64encode(blob).decode()}\n".encode()


def cosigned_message(text: bytes, timestamp: int) -> bytes:
    """What a cosignature/v1 signs: the header line, the time line and the checkpoint's note text."""
    return b"cosignature/v1\ntime %d\n" % timestamp + text


@dataclasses.dataclass(frozen=True)
class WitnessKey:
    """A witness's cosignature/v1 verifier key."""

    name: str
    public: bytes  # the 32-byte Ed25519 public key

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(self.name.encode() + b"\n" + COSIGNATURE_V1 + self.public).digest()[:4]

    def vkey(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(COSIGNATURE_V1 + self.public).decode()}"

    @classmethod
    def parse(cls, vkey: str) -> WitnessKey:
        """Read a verifier key; raises :class:`note.NoteError` saying what is wrong with it."""
        match = _VKEY.fullmatch(vkey) if isinstance(vkey, str) else None
        if match is None or not note.valid_origin(match.group(1)):
            raise note.NoteError("a witness key is name+hex key ID+base64 key (a signed-note verifier key)")
        try:
            blob = base64.b64decode(match.group(3), validate=True)
        except binascii.Error:
            raise note.NoteError("the witness key's key is not base64") from None
        if blob[:1] != COSIGNATURE_V1 or len(blob) != 1 + _ED25519_SIZE:
            raise note.NoteError("the witness key is not a cosignature/v1 key (type 0x04 and a 32-byte Ed25519 key)")
        key = cls(match.group(1), blob[1:])
        if key.key_id.hex() != match.group(2):
            raise note.NoteError(f"the witness key's key ID {match.group(2)} does not match its name and key")
        return key

    def verifies(self, text: bytes, cosignature: Cosignature) -> bool:
        """Whether ``cosignature`` is this key's over the checkpoint note text ``text``."""
        if cosignature.name != self.name or cosignature.key_id != self.key_id:
            return False
        try:
            public = ed25519.Ed25519PublicKey.from_public_bytes(self.public)
            public.verify(cosignature.signature, cosigned_message(text, cosignature.timestamp))
        except (InvalidSignature, ValueError):
            return False
        return True


def signature_lines(lines: bytes) -> list[Cosignature | None]:
    """The signature lines of ``lines`` (each ending in a newline): a :class:`Cosignature` for each one
    shaped as a cosignature/v1, None for another note signature (another algorithm, which a witness
    may send beside its Ed25519 line). Raises :class:`note.NoteError` for text that is not signature lines."""
    try:
        decoded = lines.decode()
    except UnicodeDecodeError:
        raise note.NoteError("the signature lines are not UTF-8") from None
    if not decoded.endswith("\n"):
        raise note.NoteError("signature lines end in a newline")
    parsed: list[Cosignature | None] = []
    for line in decoded[:-1].split("\n"):
        match = _SIGNATURE_LINE.fullmatch(line)
        if match is None:
            raise note.NoteError(f"not a signature line: {line[:80]!r}")
        try:
            blob = base64.b64decode(match.group(2), validate=True)
        except binascii.Error:
            raise note.NoteError(f"not base64: {line[:80]!r}") from None
        if len(blob) != 4 + 8 + _SIGNATURE_SIZE:
            parsed.append(None)
            continue
        timestamp = int.from_bytes(blob[4:12], "big")
        parsed.append(Cosignature(match.group(1), blob[:4], timestamp, blob[12:]) if timestamp <= MAX_TIMESTAMP else None)
    return parsed


def cosignature_of(key: WitnessKey, text: bytes, lines: bytes) -> Cosignature | None:
    """The cosignature by ``key`` of the checkpoint ``text`` among ``lines``, or None when none of them
    verifies under it; lines of other keys are ignored (tlog-witness). Raises :class:`note.NoteError`
    when ``lines`` are not signature lines."""
    for cosignature in signature_lines(lines):
        if cosignature is not None and key.verifies(text, cosignature):
            return cosignature
    return None


def add_checkpoint_body(old: int, proof: list[bytes], signed: bytes) -> bytes:
    """The body of ``POST <prefix>/add-checkpoint``: the old size line, the consistency proof from it
    (one base64 hash a line), an empty line, and the signed checkpoint note."""
    if len(proof) > MAX_PROOF_LINES:
        raise ValueError(f"a consistency proof has at most {MAX_PROOF_LINES} hashes")
    lines = [f"old {old}\n".encode(), *(base64.b64encode(hash_) + b"\n" for hash_ in proof)]
    return b"".join(lines) + b"\n" + signed


def parse_size(body: bytes) -> int:
    """The witness's size in a 409 answer (``text/x.tlog.size``: a decimal below 2^64 and a newline)."""
    match = re.fullmatch(rb"(0|[1-9][0-9]{0,19})\n", body)
    if match is None or int(match.group(1)) > MAX_SIZE:
        raise note.NoteError("the witness's size is not a decimal number below 2^64 and a newline")
    return int(match.group(1))


# --- What a witness's answer to add-checkpoint means ---------------------------------


@dataclasses.dataclass(frozen=True)
class Cosigned:
    cosignature: Cosignature


@dataclasses.dataclass(frozen=True)
class Conflict:
    """409: the witness last cosigned ``size`` (or, with the same size, another root)."""

    size: int | None


@dataclasses.dataclass(frozen=True)
class Refused:
    """The witness does not take this log from us (403, 404) or answered with no valid
    cosignature under its key: a setting to check, not an outage; ``reason`` says which. Or
    it holds a history this checkpoint does not extend (422; a 409 naming our own size):
    no setting explains that (``settings`` False), the log forked or the gateway's proof is wrong."""

    reason: str
    settings: bool = True


@dataclasses.dataclass(frozen=True)
class Failed:
    """Any other answer: retried with backoff."""

    reason: str


Answer = Cosigned | Conflict | Refused | Failed


def read_answer(key: WitnessKey, text: bytes, status: int, content_type: str, body: bytes) -> Answer:
    """What the answer ``status``/``content_type``/``body`` of witness ``key`` to our add-checkpoint of
    the checkpoint ``text`` means (c2sp.org/tlog-witness)."""
    if status == 200:
        try:
            cosignature = cosignature_of(key, text, body)
        except note.NoteError as exc:
            return Refused(f"its answer is not signature lines ({exc})")
        if cosignature is None:
            return Refused(f"no cosignature in its answer verifies under its vkey ({key.name}+{key.key_id.hex()})")
        return Cosigned(cosignature)
    if status == 409:
        if content_type.split(";")[0].strip().lower() != SIZE_MEDIA_TYPE:
            return Conflict(None)  # same size, another root: nothing to resubmit from
        try:
            return Conflict(parse_size(body))
        except note.NoteError as exc:
            return Failed(f"409 with an unreadable size ({exc})")
    if status == 422:
        return Refused(
            "422: the consistency proof from the tree size it holds does not verify: this checkpoint does not "
            "extend the one it cosigned (a split view?)",
            settings=False,
        )
    if status == 403:
        return Refused("403: it does not trust the gateway's signing key for this log")
    if status == 404:
        return Refused("404: it does not know this log's origin")
    return Failed(f"HTTP {status}")
