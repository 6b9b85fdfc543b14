"""What the signature and Decision tests share: an independent JWS check and a tiny auth scheme."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import orjson
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from fastapi import Request

from agent_gateway.auth.schemes import Authenticated
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import users


def b64decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def segments(jws: str) -> tuple[bytes, bytes, bytes]:
    """The decoded header, payload and signature of a compact JWS."""
    header, payload, signature = jws.split(".")
    return b64decode(header), b64decode(payload), b64decode(signature)


_CURVES = {"P-256": (ec.SECP256R1(), hashes.SHA256()), "P-384": (ec.SECP384R1(), hashes.SHA384()), "P-521": (ec.SECP521R1(), hashes.SHA512())}
_RSA_HASHES = {"RS256": hashes.SHA256(), "RS384": hashes.SHA384(), "RS512": hashes.SHA512()}


def independent_verify(jws: str, jwk: dict[str, Any]) -> dict[str, Any]:
    """Check ``jws`` against a public JWK with plain ``cryptography`` (no joserfc); return the payload.

    Raises ``cryptography.exceptions.InvalidSignature`` when the signature is wrong.
    """
    header_segment, payload_segment, signature_segment = jws.split(".")
    signing_input = f"{header_segment}.{payload_segment}".encode()
    signature = b64decode(signature_segment)
    alg = orjson.loads(b64decode(header_segment))["alg"]
    if jwk["kty"] == "OKP":
        assert (jwk["crv"], alg) == ("Ed25519", "EdDSA")
        ed25519.Ed25519PublicKey.from_public_bytes(b64decode(jwk["x"])).verify(signature, signing_input)
    elif jwk["kty"] == "EC":
        curve, digest = _CURVES[jwk["crv"]]
        assert alg == "ES" + str(digest.digest_size * 8)
        x, y = (int.from_bytes(b64decode(jwk[name]), "big") for name in ("x", "y"))
        public = ec.EllipticCurvePublicNumbers(x, y, curve).public_key()
        half = len(signature) // 2
        der = encode_dss_signature(int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big"))
        public.verify(der, signing_input, ec.ECDSA(digest))
    else:
        assert jwk["kty"] == "RSA"
        n, e = (int.from_bytes(b64decode(jwk[name]), "big") for name in ("n", "e"))
        rsa.RSAPublicNumbers(e, n).public_key().verify(signature, signing_input, padding.PKCS1v15(), _RSA_HASHES[alg])
    return orjson.loads(b64decode(payload_segment))


@dataclasses.dataclass
class BearerTestScheme:
    """Accepts ``Authorization: Bearer test-<user id>`` for an admitted User; stands in for passwords."""

    store: Store

    async def authenticate(self, request: Request) -> Authenticated | None:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer test-"):
            return None
        async with self.store.read() as conn:
            user = await users.get(conn, id=header.removeprefix("Bearer test-"))
        return Authenticated(user, self) if user else None
