"""Signing keys: generation and private writing (signatures/keys.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from agent_gateway.signatures import keys


@pytest.mark.parametrize(
    ("key_type", "check"),
    [
        ("ed25519", lambda key: isinstance(key, ed25519.Ed25519PrivateKey)),
        ("p256", lambda key: isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"),
        ("p384", lambda key: isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"),
        ("p521", lambda key: isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp521r1"),
    ],
)
def test_generate_pem(key_type: str, check: object) -> None:
    pem = keys.generate_pem(key_type)
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    assert check(serialization.load_pem_private_key(pem, password=None))  # type: ignore[operator]
    assert keys.generate_pem(key_type) != pem


def test_write_private_is_owner_only_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    keys.write_private(path, b"first")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        keys.write_private(path, b"second")
    assert path.read_bytes() == b"first"
