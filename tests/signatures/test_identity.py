"""The signing identity: loading, algorithm derivation, refusals, signing and the JWK Set."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, rsa, x25519
from joserfc.util import urlsafe_b64decode

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import jose, keys
from agent_gateway.signatures.identity import AlgorithmMismatch, SigningIdentity, SigningKeyError

from tests.signatures.helpers import independent_verify, segments


def pem_of(private_key: object, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return private_key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def rsa_pss_pem() -> bytes:
    """An RSA-PSS key (OID id-RSASSA-PSS); cryptography cannot generate one, OpenSSL can."""
    result = subprocess.run(
        ["openssl", "genpkey", "-algorithm", "RSA-PSS", "-pkeyopt", "rsa_keygen_bits:2048"],
        capture_output=True,
        check=True,
    )
    assert result.stdout.startswith(b"-----BEGIN PRIVATE KEY-----")
    return result.stdout


@pytest.mark.parametrize(
    ("key_type", "algorithm", "jwk_shape"),
    [
        ("ed25519", "EdDSA", {"kty": "OKP", "crv": "Ed25519"}),
        ("p256", "ES256", {"kty": "EC", "crv": "P-256"}),
        ("p384", "ES384", {"kty": "EC", "crv": "P-384"}),
        ("p521", "ES512", {"kty": "EC", "crv": "P-521"}),
    ],
)
def test_the_algorithm_is_derived_from_the_key(key_type: str, algorithm: str, jwk_shape: dict) -> None:
    identity = SigningIdentity(keys.generate_pem(key_type))
    assert identity.algorithm == algorithm
    token = identity.sign(b'{"statement":"x"}', "t")
    header, payload, _ = segments(token)
    assert orjson.loads(header) == {"alg": algorithm, "typ": "t"}
    assert payload == b'{"statement":"x"}'
    (jwk,) = identity.jwks()["keys"]
    assert {name: jwk[name] for name in jwk_shape} == jwk_shape
    assert independent_verify(token, jwk) == {"statement": "x"}


REFUSED_WITHOUT_ALGORITHM = {
    "RSA": lambda: pem_of(rsa.generate_private_key(65537, 2048)),
    "RSA-PSS": rsa_pss_pem,
    "Ed448": lambda: pem_of(ed448.Ed448PrivateKey.generate()),
    "secp256k1": lambda: pem_of(ec.generate_private_key(ec.SECP256K1())),
}


@pytest.mark.parametrize("kind", REFUSED_WITHOUT_ALGORITHM)
def test_other_keys_are_refused_without_an_algorithm(kind: str) -> None:
    with pytest.raises(SigningKeyError, match="signing.algorithm: required"):
        SigningIdentity(REFUSED_WITHOUT_ALGORITHM[kind]())


@pytest.mark.parametrize(
    ("kind", "algorithm", "kty"),
    [("RSA", "RS256", "RSA"), ("RSA", "PS384", "RSA"), ("RSA-PSS", "PS256", "RSA"), ("Ed448", "EdDSA", "OKP"), ("secp256k1", "ES256K", "EC")],
)
def test_other_keys_sign_with_a_configured_algorithm(kind: str, algorithm: str, kty: str) -> None:
    identity = SigningIdentity(REFUSED_WITHOUT_ALGORITHM[kind](), algorithm)
    token = identity.sign(b'{"statement":"x"}', "t")
    verified = identity.verify(token)
    assert verified is not None and verified.header == {"alg": algorithm, "typ": "t"}
    (jwk,) = identity.jwks()["keys"]
    assert jwk["kty"] == kty


@pytest.mark.parametrize("pem", [keys.generate_pem("ed25519"), REFUSED_WITHOUT_ALGORITHM["Ed448"]()], ids=["Ed25519", "Ed448"])
@pytest.mark.parametrize("statement", ["x", "", "é\u2028" * 3, "s" * 300_000], ids=["short", "empty", "unicode", "long"])
def test_edwards_keys_sign_straight_as_joserfc_would(pem: bytes, statement: str) -> None:
    # EdDSA is deterministic: the signature made straight (Ed25519 by libsodium, Ed448 by
    # cryptography) is joserfc's, made by OpenSSL, byte for byte.
    identity = SigningIdentity(pem, "EdDSA")
    header, payload, signature = identity.sign(orjson.dumps({"statement": statement}), "t").split(".")
    expected = jose.algorithm("EdDSA").sign(f"{header}.{payload}".encode(), identity.key)
    assert urlsafe_b64decode(signature.encode()) == expected
    assert identity.verify(f"{header}.{payload}.{signature}") is not None


@pytest.mark.parametrize("curve", [ec.BrainpoolP256R1(), ec.SECP224R1(), ec.BrainpoolP384R1()])
@pytest.mark.parametrize("algorithm", [None, "ES256"])
def test_other_curves_are_refused_with_or_without_an_algorithm(curve: ec.EllipticCurve, algorithm: str | None) -> None:
    with pytest.raises(SigningKeyError, match=f"a {curve.name} key has no JWK form"):
        SigningIdentity(pem_of(ec.generate_private_key(curve)), algorithm)


@pytest.mark.parametrize(("key_type", "algorithm"), [("ed25519", "ES256"), ("p256", "ES384"), ("p256", "EdDSA"), ("ed25519", "RS256")])
def test_an_algorithm_the_key_cannot_perform_fails_at_first_signing(key_type: str, algorithm: str) -> None:
    identity = SigningIdentity(keys.generate_pem(key_type), algorithm)  # construction succeeds
    for _ in range(2):  # and every signing fails the same way, not only the first
        with pytest.raises(AlgorithmMismatch, match=f"signing.algorithm '{algorithm}' cannot be performed"):
            identity.sign(b'{"statement":"x"}', "t")


@pytest.mark.parametrize("algorithm", ["none", "HS256", "XYZ", "eddsa"])
def test_an_algorithm_that_is_not_a_signature_algorithm_is_refused_at_construction(algorithm: str) -> None:
    with pytest.raises(SigningKeyError, match="not a JWS signature algorithm"):
        SigningIdentity(keys.generate_pem("ed25519"), algorithm)


@pytest.mark.parametrize(
    ("pem", "message"),
    [
        (b"", "not a PEM private key"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "not a PEM private key"),
        (
            ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            "not a PEM private key",
        ),
        (pem_of(ec.generate_private_key(ec.SECP256R1()), b"secret"), "encrypted PEM keys are not supported"),
        (pem_of(x25519.X25519PrivateKey.generate()), "cannot be a JOSE signing key"),
    ],
)
def test_unusable_keys_are_refused(pem: bytes, message: str) -> None:
    with pytest.raises(SigningKeyError, match=message):
        SigningIdentity(pem)


def test_the_key_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    file_pem, env_pem = keys.generate_pem("ed25519"), keys.generate_pem("p256")
    keys.write_private(tmp_path / "key.pem", file_pem)
    (tmp_path / "gateway.toml").write_text('[auth]\ntoken_ttl_ms = 1000\n[signing]\nkey_file = "key.pem"\n')
    from_file = SigningIdentity.from_settings(config.load(tmp_path / "gateway.toml", environ={}))
    assert from_file.jwks() == SigningIdentity(file_pem).jwks()
    # For containers: the PEM text in AGENT_GATEWAY_SIGNING_KEY wins over the file.
    environ = {"AGENT_GATEWAY_SIGNING_KEY": env_pem.decode()}
    from_env = SigningIdentity.from_settings(config.load(tmp_path / "gateway.toml", environ=environ))
    assert from_env.algorithm == "ES256" and from_env.jwks() == SigningIdentity(env_pem).jwks()
    algorithm = {**environ, "AGENT_GATEWAY_SIGNING_ALGORITHM": "ES384"}
    mismatched = SigningIdentity.from_settings(config.load(tmp_path / "gateway.toml", environ=algorithm))
    assert mismatched.algorithm == "ES384"


def test_the_gateway_refuses_to_start_without_a_signing_key(settings: config.Settings, tmp_path: Path) -> None:
    import dataclasses

    with pytest.raises(SigningKeyError, match="signing.key_file: required"):
        Gateway(dataclasses.replace(settings, signing_key_file=None, signing_key_pem=None))
    with pytest.raises(SigningKeyError, match="cannot read"):
        Gateway(dataclasses.replace(settings, signing_key_file=tmp_path / "missing.pem"))


@pytest.mark.parametrize("key_type", list(keys.KEY_TYPES))
def test_the_jwk_set_holds_exactly_one_public_key(key_type: str) -> None:
    identity = SigningIdentity(keys.generate_pem(key_type))
    document = identity.jwks()
    assert list(document) == ["keys"] and len(document["keys"]) == 1
    (jwk,) = document["keys"]
    assert set(jwk) <= {"kty", "crv", "x", "y", "n", "e"}  # no kid, use, alg, and no private "d"


def test_the_rsa_jwk_has_no_private_members() -> None:
    (jwk,) = SigningIdentity(REFUSED_WITHOUT_ALGORITHM["RSA"](), "RS256").jwks()["keys"]
    assert set(jwk) == {"kty", "n", "e"}
