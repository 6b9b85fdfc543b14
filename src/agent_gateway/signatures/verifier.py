"""The offline verifier: check an artifact against a JWK Set, without the gateway or its database.

This is what a third party runs (``agent-gateway verify JWS --jwks
FILE_OR_URL``): verification by anyone is done against ``GET /jwks.json``,
whereas ``POST /verify`` must be believed on trust (spec: Authentication 10).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from joserfc.errors import JoseError
from joserfc.jwk import Key, import_key

from agent_gateway import errors
from agent_gateway.signatures import jose

FETCH_TIMEOUT_S = 10
_PUBLIC_KEY_TYPES = ("OKP", "EC", "RSA")


class JwkSetError(errors.GatewayError):
    """The JWK Set cannot be read or holds no usable public key; the message says why."""


def load_jwk_set(source: str) -> list[Key]:
    """The keys of the JWK Set at ``source``: an ``http(s)://`` URL or a file path."""
    if source.startswith(("http://", "https://")):
        import httpx  # only here: several MB that a serving gateway never needs

        try:
            response = httpx.get(source, timeout=FETCH_TIMEOUT_S, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise JwkSetError(f"cannot fetch {source}: {exc}") from None
        # Not raise_for_status(): its message runs over two lines, and errors here are one.
        if response.status_code != 200:
            raise JwkSetError(f"cannot fetch {source}: it answered {response.status_code}")
        content = response.content
    else:
        try:
            content = Path(source).read_bytes()
        except OSError as exc:
            raise JwkSetError(f"cannot read {source}: {exc.strerror}") from None
    try:
        return parse_jwk_set(orjson.loads(content))
    except orjson.JSONDecodeError as exc:
        raise JwkSetError(f"{source} is not JSON: {exc}") from None


def parse_jwk_set(document: Any) -> list[Key]:
    """The signature keys of a JWK Set document (RFC 7517 section 5)."""
    members = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(members, list):
        raise JwkSetError('not a JWK Set: expected an object with a "keys" array')
    keys: list[Key] = []
    for member in members:
        if not isinstance(member, dict):
            raise JwkSetError("not a usable JWK: a member of keys is not an object")
        # RFC 7517 section 5: ignore key types not understood; a secret (oct) key never verifies here.
        if member.get("kty") not in _PUBLIC_KEY_TYPES:
            continue
        try:
            key = import_key(member)
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise JwkSetError(f"not a usable JWK: {exc}") from None
        if jose.compatible_algorithms(key):
            keys.append(key)
    if not keys:
        raise JwkSetError("the JWK Set holds no public signature key")
    return keys


def verify(token: str, keys: list[Key]) -> jose.Verified | None:
    """The header and payload of ``token`` when a key of the set verifies it; None otherwise.

    Each key accepts only the algorithms it can perform (``alg: none`` and
    HMAC never verify), so a header cannot choose a weaker check.
    """
    for key in keys:
        verified = jose.verify_compact(token, key, jose.Registry(jose.compatible_algorithms(key)))
        if verified is not None:
            return verified
    return None
