"""The signing identity: one private key held in the process (spec: Authentication 10).

The key is a PEM private key (PKCS#8; the older PKCS#1/SEC1 PEM forms load
too) from ``signing.key_file`` or, for container deployments, the PEM text in
``signing.key`` / ``AGENT_GATEWAY_SIGNING_KEY``. The JOSE algorithm is derived
from the key: EdDSA for Ed25519, ES256/ES384/ES512 for P-256/P-384/P-521.
Any other key (RSA, RSA-PSS, Ed448, secp256k1, ...) is refused unless
``signing.algorithm`` names one; an algorithm the key cannot perform is
only found out when signing, as the spec says, with a clear error.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import nacl.bindings
import orjson
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey
from joserfc.util import urlsafe_b64encode

from agent_gateway.config import Settings, SettingsError
from agent_gateway.signatures import jose

DERIVED_ALGORITHMS = {"Ed25519": "EdDSA", "P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
# cryptography's curve names for the NIST curves JOSE names P-256, P-384, P-521.
_NIST_CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
# Distinct typ values whose encoded header is kept; /sign mostly sees one or two.
_HEADER_CACHE_SIZE = 256


class SigningKeyError(SettingsError):
    """The signing key is missing, unreadable or cannot be used; the message says which."""


# Not an errors.GatewayError: raised while a route signs, a misconfiguration must stay the
# logged bare 500 ("internal error"), not a 500 that tells the caller about the settings.
class AlgorithmMismatch(Exception):
    """The configured signing algorithm cannot be performed by the signing key."""


class SigningIdentity:
    """The gateway's one private key and its JOSE algorithm; signs and verifies compact JWS."""

    def __init__(self, pem: bytes, algorithm: str | None = None) -> None:
        self.key, kind = _import(pem)
        if algorithm is None:
            algorithm = DERIVED_ALGORITHMS.get(kind)
            if algorithm is None:
                raise SigningKeyError(
                    f"signing.algorithm: required for this {kind} key (the algorithm is derived only for "
                    "Ed25519, P-256, P-384 and P-521 keys)"
                )
        try:
            self._alg = jose.algorithm(algorithm)
        except KeyError:
            raise SigningKeyError(f"signing.algorithm: {algorithm!r} is not a JWS signature algorithm") from None
        self.algorithm = algorithm
        self.kind = kind
        self._registry = jose.Registry([algorithm])
        public = self.key.as_dict(private=False)
        # The published key: key type and public members only; no kid, use or alg.
        self._public_jwk = {name: public[name] for name in ("kty", "crv", "x", "y", "n", "e") if name in public}
        self._public_key = type(self.key).import_key(self._public_jwk)
        # An EdDSA signature is the Edwards key's own: signed straight, without joserfc's checks of
        # the key on every call (a sixth of a Decision's signing time). Ed25519 by libsodium, whose
        # signature took 18 µs where OpenSSL's (cryptography's) took 33 µs, a third of a POST /sign;
        # EdDSA is deterministic, so the two sign byte for byte alike. Ed448 by cryptography.
        native = self.key.private_key if algorithm == "EdDSA" else None
        self._ed25519: bytes | None = None
        self._ed448 = native if isinstance(native, ed448.Ed448PrivateKey) else None
        if isinstance(native, ed25519.Ed25519PrivateKey):
            seed = native.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
            # libsodium's secret key: the seed, then the public key it derives.
            self._ed25519 = nacl.bindings.crypto_sign_seed_keypair(seed)[1]

    @classmethod
    def from_settings(cls, settings: Settings) -> SigningIdentity:
        """The identity the settings name; raises :class:`SigningKeyError` when there is none."""
        if settings.signing_key_pem is not None:
            pem = settings.signing_key_pem.encode()
        elif settings.signing_key_file is not None:
            pem = _read(settings.signing_key_file)
        else:
            raise SigningKeyError(
                "signing.key_file: required (or the PEM itself in signing.key / AGENT_GATEWAY_SIGNING_KEY); "
                "the gateway does not start without a signing key"
            )
        return cls(pem, settings.signing_algorithm)

    def sign(self, payload: bytes, typ: str) -> str:
        """A compact JWS of ``payload`` (bytes as given) under the protected header ``{alg, typ}``.

        Raises :class:`AlgorithmMismatch` when the configured algorithm cannot
        be performed by the key.
        """
        signing_input = self._header_segment(typ) + b"." + urlsafe_b64encode(payload)
        try:
            if self._ed25519 is not None:
                # crypto_sign answers the signature, then the message.
                signature = nacl.bindings.crypto_sign(signing_input, self._ed25519)[: nacl.bindings.crypto_sign_BYTES]
            elif self._ed448 is not None:
                signature = self._ed448.sign(signing_input)
            else:
                signature = self._alg.sign(signing_input, self.key)
        except (JoseError, TypeError, ValueError) as exc:
            raise AlgorithmMismatch(
                f"signing.algorithm {self.algorithm!r} cannot be performed by the {self.kind} signing key: {exc}"
            ) from None
        return (signing_input + b"." + urlsafe_b64encode(signature)).decode("ascii")

    @functools.lru_cache(maxsize=_HEADER_CACHE_SIZE)  # noqa: B019 - one identity per process
    def _header_segment(self, typ: str) -> bytes:
        try:
            self._alg.check_key(self.key)
        except JoseError as exc:
            raise AlgorithmMismatch(
                f"signing.algorithm {self.algorithm!r} cannot be performed by the {self.kind} signing key: {exc}"
            ) from None
        return urlsafe_b64encode(orjson.dumps({"alg": self.algorithm, "typ": typ}))

    def verify(self, token: str) -> jose.Verified | None:
        """The header and payload of ``token`` when it is a valid artifact of this key and algorithm."""
        return jose.verify_compact(token, self._public_key, self._registry)

    def jwks(self) -> dict[str, Any]:
        """The JWK Set publishing this identity: exactly one public key, no kid, no private members."""
        return {"keys": [dict(self._public_jwk)]}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"signing.key_file: cannot read {path}: {exc.strerror}") from None


def _import(pem: bytes) -> tuple[Key, str]:
    """The joserfc key of a PEM private key, and its kind (a JOSE curve name, or RSA)."""
    try:
        native = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise SigningKeyError("signing key: encrypted PEM keys are not supported; store it unencrypted, mode 0600") from None
    except ValueError as exc:
        raise SigningKeyError(f"signing key: not a PEM private key ({exc})") from None
    except UnsupportedAlgorithm as exc:
        raise SigningKeyError(f"signing key: unsupported key ({exc})") from None
    key_class: type[Key]
    if isinstance(native, ed25519.Ed25519PrivateKey):
        key_class, kind = OKPKey, "Ed25519"
    elif isinstance(native, ed448.Ed448PrivateKey):
        key_class, kind = OKPKey, "Ed448"
    elif isinstance(native, ec.EllipticCurvePrivateKey):
        key_class, kind = ECKey, _NIST_CURVES.get(native.curve.name, native.curve.name)
    elif isinstance(native, rsa.RSAPrivateKey):
        key_class, kind = RSAKey, "RSA"
    else:
        raise SigningKeyError(f"signing key: a {type(native).__name__} cannot be a JOSE signing key")
    try:
        key = key_class.import_key(pem)
        key.as_dict(private=False)
    except (JoseError, KeyError, ValueError):
        # joserfc has no JWK form for this curve (brainpool and the like).
        raise SigningKeyError(f"signing key: a {kind} key has no JWK form, so it cannot be published") from None
    return key, kind
