"""The offline verifier's JWK Set handling (the command is in test_cli.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from agent_gateway.signatures import keys, verifier
from agent_gateway.signatures.identity import SigningIdentity


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b"not json", "not JSON"),
        (b'{"keys": "x"}', "not a JWK Set"),
        (b"[]", "not a JWK Set"),
        (b'{"keys": []}', "no public signature key"),
        (b'{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "no public signature key"),
        (b'{"keys": [{"kty": "OKP", "crv": "Ed25519"}]}', "not a usable JWK"),
        (b'{"keys": [{"kty": "nope"}]}', "no public signature key"),
        (b'{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}', "not a usable JWK"),
        (b'{"keys": ["x"]}', "not a usable JWK"),
    ],
)
def test_an_unusable_jwk_set_is_explained(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "jwks.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(verifier.JwkSetError, match=message):
        verifier.load_jwk_set(str(path))


def test_any_key_of_the_set_may_verify(tmp_path: Path) -> None:
    mine, other = (SigningIdentity(keys.generate_pem(t)) for t in ("p256", "ed25519"))
    path = tmp_path / "jwks.json"
    path.write_bytes(orjson.dumps({"keys": other.jwks()["keys"] + mine.jwks()["keys"]}))
    keys_ = verifier.load_jwk_set(str(path))
    verified = verifier.verify(mine.sign(b'{"statement":"s"}', "t"), keys_)
    assert verified is not None and verified.payload == {"statement": "s"}


def test_a_header_cannot_pick_a_weaker_algorithm() -> None:
    identity = SigningIdentity(keys.generate_pem("p256"))
    keys_ = verifier.parse_jwk_set(identity.jwks())
    payload = base64.urlsafe_b64encode(b'{"statement":"s"}').rstrip(b"=").decode()
    none = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    assert verifier.verify(f"{none}.{payload}.", keys_) is None
    # ES384 is not what a P-256 key performs, even when the signature bytes are valid ES256.
    es384 = base64.urlsafe_b64encode(b'{"alg":"ES384"}').rstrip(b"=").decode()
    real = identity.sign(b'{"statement":"s"}', "t")
    assert verifier.verify(f"{es384}.{payload}.{real.split('.')[2]}", keys_) is None
