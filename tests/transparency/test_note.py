"""Checkpoints as C2SP signed notes, for every kind of signing key the gateway takes."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway import merkle
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.transparency import note
from tests.signatures.test_key_types import rsa_pem

ORIGIN = "example.com/decisions"
CHECKPOINT = note.Checkpoint(ORIGIN, 5, merkle.node_hash(b"a" * 32, b"b" * 32))

IDENTITIES = {
    "Ed25519": lambda: SigningIdentity(keys.generate_pem("ed25519")),
    "P-256": lambda: SigningIdentity(keys.generate_pem("p256")),
    "P-384": lambda: SigningIdentity(keys.generate_pem("p384")),
    "P-521": lambda: SigningIdentity(keys.generate_pem("p521")),
    "RSA RS256": lambda: SigningIdentity(rsa_pem(), "RS256"),
    "RSA PS384": lambda: SigningIdentity(rsa_pem(), "PS384"),
}


@pytest.mark.parametrize("kind", IDENTITIES)
def test_a_signed_checkpoint_verifies_with_the_published_jwk_alone(kind: str) -> None:
    identity = IDENTITIES[kind]()
    signer = note.NoteSigner(ORIGIN, identity.key, identity.algorithm)
    signed = signer.sign(CHECKPOINT.text())
    body, _, line = signed.decode().rpartition("\n\n")
    text = body + "\n"
    assert line.startswith(f"\u2014 {ORIGIN} ") and line.endswith("\n") and line.count("\n") == 1
    assert text == f"{ORIGIN}\n5\n{base64.b64encode(CHECKPOINT.root).decode()}\n"
    [jwk] = identity.jwks()["keys"]
    verifier_keys = note.note_keys(ORIGIN, jwk)
    assert note.Checkpoint.parse(note.open_note(signed, verifier_keys)) == CHECKPOINT
    # Another key of the same kind, a changed size, or a signature of a known key that fails.
    [other] = IDENTITIES[kind]().jwks()["keys"]
    with pytest.raises(note.NoteError, match="no signature"):
        note.open_note(signed, note.note_keys(ORIGIN, other))
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(signed.replace(b"\n5\n", b"\n6\n"), verifier_keys)


def test_the_ed25519_key_id_and_vkey_are_signed_note_s() -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    identity = SigningIdentity(pem)
    signer = note.NoteSigner(ORIGIN, identity.key, identity.algorithm)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_id = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + raw).digest()[:4]
    encoded = base64.b64encode(b"\x01" + raw).decode()
    assert signer.key.vkey() == f"{ORIGIN}+{key_id.hex()}+{encoded}"
    signed = signer.sign(CHECKPOINT.text())
    signature = base64.b64decode(signed.decode().rsplit(" ", 1)[1])
    assert signature[:4] == key_id
    private.public_key().verify(signature[4:], CHECKPOINT.text())  # Ed25519 over the body bytes


def test_the_ecdsa_key_id_is_the_hash_of_the_spki() -> None:
    identity = SigningIdentity(keys.generate_pem("p256"))
    signer = note.NoteSigner(ORIGIN, identity.key, identity.algorithm)
    spki = identity.key.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert signer.key.key_id == hashlib.sha256(spki).digest()[:4]
    assert signer.key.vkey().endswith("+" + base64.b64encode(b"\x02" + spki).decode())


def test_malformed_notes_and_checkpoints_are_refused() -> None:
    identity = IDENTITIES["Ed25519"]()
    [jwk] = identity.jwks()["keys"]
    verifier_keys = note.note_keys(ORIGIN, jwk)
    signed = note.NoteSigner(ORIGIN, identity.key, identity.algorithm).sign(CHECKPOINT.text())
    for broken in (signed.replace(b"\n\n", b"\n"), signed + b"junk", signed.replace(b"\xe2\x80\x94", b"--"), b"\x01" + signed):
        with pytest.raises(note.NoteError):
            note.open_note(broken, verifier_keys)
    for text in (b"origin\n5\n", b"origin\nfive\n" + base64.b64encode(bytes(32)) + b"\n", b"origin\n5\nAAAA\n"):
        with pytest.raises(note.NoteError):
            note.Checkpoint.parse(text)
