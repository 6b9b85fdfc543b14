"""Signing keys: generating and writing them (PKCS#8 PEM, mode 0600)."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

KEY_TYPES = {
    "ed25519": ed25519.Ed25519PrivateKey.generate,
    "p256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "p384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "p521": lambda: ec.generate_private_key(ec.SECP521R1()),
}


def generate_pem(key_type: str = "ed25519") -> bytes:
    """A fresh private key of ``key_type`` as PKCS#8 PEM."""
    key = KEY_TYPES[key_type]()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_private(path: Path, pem: bytes) -> None:
    """Write ``pem`` to a new file readable by its owner only; never overwrite."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
