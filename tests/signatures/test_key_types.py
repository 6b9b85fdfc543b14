"""Offline verification of /sign and /decisions artifacts against /jwks.json, for every key type.

The check here is independent of the gateway's JOSE library: plain
``cryptography`` rebuilds the public key from the published JWK.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys, verifier
from agent_gateway.users import service as users

from tests.signatures.helpers import BearerTestScheme, independent_verify, segments


def rsa_pem() -> bytes:
    return rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


KEY_TYPES = {
    "Ed25519": (lambda: keys.generate_pem("ed25519"), None, "EdDSA"),
    "P-256": (lambda: keys.generate_pem("p256"), None, "ES256"),
    "P-384": (lambda: keys.generate_pem("p384"), None, "ES384"),
    "P-521": (lambda: keys.generate_pem("p521"), None, "ES512"),
    "RSA": (rsa_pem, "RS256", "RS256"),
}


@pytest.fixture(params=list(KEY_TYPES))
async def typed_gateway(request: pytest.FixtureRequest, settings: config.Settings, tmp_path: Path) -> AsyncIterator[tuple[Gateway, str]]:
    make, configured, expected = KEY_TYPES[request.param]
    path = tmp_path / "key.pem"
    keys.write_private(path, make())
    gateway = Gateway(dataclasses.replace(settings, signing_key_file=path, signing_algorithm=configured))
    await gateway.start()
    yield gateway, expected
    await gateway.stop()


async def test_artifacts_verify_offline_against_the_published_jwk_set(typed_gateway: tuple[Gateway, str]) -> None:
    gateway, algorithm = typed_gateway
    agent = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_app), base_url="http://agent")
    public = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.public_app), base_url="http://public")
    async with agent, public:
        jwk_set = (await public.get("/jwks.json")).json()
        (jwk,) = jwk_set["keys"]
        statement = (await agent.post("/sign", json={"statement": "s"})).json()["jws"]
        decision = (await agent.post("/decisions", json={"statement": "d"})).json()
        for jws in (statement, decision["jws"]):
            assert segments(jws)[0].startswith(f'{{"alg":"{algorithm}",'.encode())
        # An independent check with plain cryptography...
        assert independent_verify(statement, jwk) == {"statement": "s"}
        assert independent_verify(decision["jws"], jwk) == {"seq": decision["seq"], "createdAt": decision["createdAt"], "statement": "d"}
        with pytest.raises(InvalidSignature):
            independent_verify(statement.rsplit(".", 1)[0] + "." + decision["jws"].rsplit(".", 1)[1], jwk)
        # ...agrees with the offline verifier a third party runs, and with POST /verify.
        keys_ = verifier.parse_jwk_set(jwk_set)
        for jws in (statement, decision["jws"]):
            assert verifier.verify(jws, keys_) is not None
            assert verifier.verify(jws[:-2] + ("AA" if not jws.endswith("AA") else "BA"), keys_) is None
        gateway.auth_schemes.append(BearerTestScheme(gateway.store))
        async with gateway.store.transaction() as conn:
            user = await users.admit(conn)
        answer = (await public.post("/verify", json={"jws": decision["jws"]}, headers={"Authorization": f"Bearer test-{user.id}"})).json()
        assert answer["verified"] is True and answer["header"] == {"alg": algorithm, "typ": "service-decision+jws"}


async def test_an_algorithm_the_key_cannot_perform_fails_every_signing_and_stores_nothing(settings: config.Settings) -> None:
    # Construction succeeds (spec: the mismatch fails at first signing); the operator sees the
    # cause in the server log, a client sees the standard 500 body.
    gateway = Gateway(dataclasses.replace(settings, signing_algorithm="ES256"))
    await gateway.start()
    transport = httpx.ASGITransport(app=gateway.agent_app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as agent:
            for path in ("/sign", "/decisions", "/sign"):
                response = await agent.post(path, json={"statement": "s"})
                assert response.status_code == 500
                assert response.json() == {"statusCode": 500, "error": "Internal Server Error", "message": "internal error"}
            assert (await agent.get("/decisions")).json() == {"decisions": []}
    finally:
        await gateway.stop()
