"""Checkpoints (c2sp.org/tlog-checkpoint) as signed notes (c2sp.org/signed-note), with the gateway's key.

The signature type follows the key, so that ``GET /jwks.json`` is all a
verifier needs:

* Ed25519: type 0x01, as signed-note specifies it. Key ID = SHA-256(origin ||
  0x0A || 0x01 || 32-byte public key)[:4]; the signature is Ed25519 over the
  note text.
* EC (P-256, P-384, P-521): type 0x02, "ECDSA signatures as implemented by
  transparency-dev/witness": key ID = SHA-256(DER SubjectPublicKeyInfo)[:4];
  the signature is ASN.1 DER ECDSA over the note text, hashed with the hash of
  the key's JOSE algorithm (SHA-256 for P-256 as the witness does; SHA-384 and
  SHA-512 for P-384 and P-521, our choice, as signed-note names no hash).
* any other key (RSA, Ed448, with an explicit JOSE algorithm): type 0xff
  followed by ``agent-gateway/jws/<alg>`` (signed-note's escape for types it
  does not assign); key ID = SHA-256(origin || 0x0A || type || DER
  SubjectPublicKeyInfo)[:4]; the signature is the JOSE algorithm's signature
  bytes over the note text.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

from agent_gateway import errors, merkle
from agent_gateway.signatures import jose

ED25519 = b"\x01"
ECDSA = b"\x02"
JWS_TYPE_PREFIX = b"\xffagent-gateway/jws/"
_EC_HASHES = {"P-256": hashes.SHA256, "P-384": hashes.SHA384, "P-521": hashes.SHA512}
# JOSE algorithms a key of the 0xff type may use; a verifier finds which by the key ID.
_OTHER_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA", "Ed448")
# Key names (origins): non-empty, no Unicode spaces, no "+" (signed-note).
_KEY_NAME = re.compile(r"[^\s+]+")
SIGNATURE_PREFIX = "\u2014 "
# Tree sizes are 64-bit (tlog-checkpoint). A size is read only up to 20 digits, so that a hostile
# note cannot make int() convert thousands of them (which it refuses with a ValueError).
MAX_SIZE = 2**64 - 1
_SIZE = re.compile(r"0|[1-9][0-9]{0,19}")
_SIGNATURE_LINE = re.compile(r"\u2014 ([^\s+]+) ([A-Za-z0-9+/]+={0,2})")


class NoteError(errors.GatewayError):
    """A signed note or checkpoint that does not verify or cannot be read; the message says why."""


def valid_origin(origin: str) -> bool:
    return _KEY_NAME.fullmatch(origin) is not None and all(ord(c) >= 0x20 for c in origin)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A tree head: ``size`` leaves whose RFC 9162 root is ``root``, in the log named ``origin``."""

    origin: str
    size: int
    root: bytes

    def text(self) -> bytes:
        """The note text (tlog-checkpoint): origin, size, base64 root, each ending in a newline."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n".encode()

    @classmethod
    def parse(cls, text: bytes) -> Checkpoint:
        try:
            lines = text.decode().split("\n")
        except UnicodeDecodeError:
            raise NoteError("the checkpoint is not UTF-8") from None
        if len(lines) < 4 or lines[-1] != "":
            raise NoteError("a checkpoint has an origin, a size and a root hash, each on its own line")
        origin, size, root = lines[:3]
        if not _SIZE.fullmatch(size) or int(size) > MAX_SIZE:
            shown = repr(size) if len(size) <= 40 else f"of {len(size)} characters"
            raise NoteError(f"the checkpoint's size {shown} is not a decimal number below 2^64")
        try:
            digest = base64.b64decode(root, validate=True)
        except ValueError:
            digest = b""
        if len(digest) != merkle.HASH_SIZE:
            raise NoteError("the checkpoint's root hash is not 32 bytes of base64")
        return cls(origin, int(size), digest)


@dataclasses.dataclass(frozen=True)
class NoteKey:
    """One public key as a signed-note key: its type, key ID, and how it verifies."""

    name: str
    type: bytes
    encoded: bytes  # the public key as signed-note encodes it for this type
    key: Key
    algorithm: str

    @property
    def key_id(self) -> bytes:
        if self.type == ECDSA:
            return hashlib.sha256(self.encoded).digest()[:4]
        return hashlib.sha256(self.name.encode() + b"\n" + self.type + self.encoded).digest()[:4]

    def vkey(self) -> str:
        """The verifier key (signed-note "vkey"): name+hex key ID+base64(type || public key)."""
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(self.type + self.encoded).decode()}"

    def verifies(self, text: bytes, signature: bytes) -> bool:
        native = self.key.public_key
        try:
            if self.type == ED25519:
                native.verify(signature, text)
            elif self.type == ECDSA:
                native.verify(signature, text, ec.ECDSA(_EC_HASHES[self.key.as_dict()["crv"]]()))
            else:
                return bool(jose.algorithm(self.algorithm).verify(text, signature, self.key))
        except (InvalidSignature, JoseError, ValueError):
            return False
        return True


def note_keys(name: str, jwk: Any, algorithm: str | None = None) -> list[NoteKey]:
    """The note keys a published JWK can be (several only for the 0xff type, one per algorithm)."""
    try:
        key: Key = {"OKP": OKPKey, "EC": ECKey, "RSA": RSAKey}[jwk["kty"]].import_key(jwk)
    except (KeyError, TypeError, ValueError, JoseError) as exc:
        raise NoteError(f"the JWK Set's key cannot be read ({type(exc).__name__})") from None
    curve = key.as_dict().get("crv")
    if curve == "Ed25519":
        raw = key.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return [NoteKey(name, ED25519, raw, key, "EdDSA")]
    spki = key.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if curve in _EC_HASHES:
        return [NoteKey(name, ECDSA, spki, key, "")]
    algorithms = [algorithm] if algorithm else [alg for alg in _OTHER_ALGORITHMS if alg in jose.Registry.algorithms]
    return [NoteKey(name, JWS_TYPE_PREFIX + alg.encode(), spki, key, alg) for alg in algorithms]


class NoteSigner:
    """Signs notes with the gateway's signing identity under the key name ``origin``."""

    def __init__(self, origin: str, key: Key, algorithm: str) -> None:
        self.origin = origin
        self._private = key
        self.key = note_keys(origin, key.as_dict(private=False), algorithm)[0]

    def sign(self, text: bytes) -> bytes:
        """The signed note: ``text``, a blank line, and this key's signature line."""
        native = self._private.private_key
        if self.key.type == ED25519:
            signature = native.sign(text)
        elif self.key.type == ECDSA:
            signature = native.sign(text, ec.ECDSA(_EC_HASHES[self.key.key.as_dict()["crv"]]()))
        else:
            signature = jose.algorithm(self.key.algorithm).sign(text, self._private)
        line = f"{SIGNATURE_PREFIX}{self.origin} {base64.b64encode(self.key.key_id + signature).decode()}\n"
        return text + b"\n" + line.encode()


def open_note(note: bytes, keys: list[NoteKey]) -> bytes:
    """The text of ``note`` once a signature by one of ``keys`` verifies (signed-note's rules:
    signatures of unknown keys are ignored; a known key's failing signature rejects the note)."""
    try:
        note.decode()
    except UnicodeDecodeError:
        raise NoteError("the note is not UTF-8") from None
    if any(byte < 0x20 and byte != 0x0A for byte in note):
        raise NoteError("the note holds a control character")
    cut = note.rfind(b"\n\n")
    if cut < 0 or not note.endswith(b"\n"):
        raise NoteError("the note has no signature lines")
    text, lines = note[: cut + 1], note[cut + 2 : -1].decode().split("\n")
    verified = False
    for line in lines:
        name, signature = _signature_line(line)
        for key in keys:
            if key.name == name and signature[:4] == key.key_id:
                if not key.verifies(text, signature[4:]):
                    raise NoteError(f"the signature of {key.name} does not verify")
                verified = True
    if not verified:
        raise NoteError("no signature by the gateway's key")
    return text


def _signature_line(line: str) -> tuple[str, bytes]:
    """The key name, and the key ID with the signature, of a signature line. A line that is no signature
    line (no em dash, a bad key name, base64 that does not decode, less than a key ID and one byte)
    makes the whole note malformed, whoever's key it names: signed-note ignores the signatures of
    unknown keys, not lines that are no signature (Go's ``note.Open`` refuses such a note too)."""
    match = _SIGNATURE_LINE.fullmatch(line)
    try:
        signature = base64.b64decode(match.group(2), validate=True) if match else b""
    except ValueError:
        signature = b""
    if match is None or len(signature) < 5:
        shown = line if len(line) <= 80 else line[:80] + "…"
        raise NoteError(f"malformed signature line {shown!r}")
    return match.group(1), signature
