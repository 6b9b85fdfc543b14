"""Signatures: signing Statements and claims, verifying artifacts (spec: Signed Statement, JWK Set).

Every artifact is a compact JWS whose protected header is ``{alg, typ}`` and
whose payload is the JSON text of the claims, members in the order given
(the order is part of the signed bytes). Nothing signed here is stored or
numbered; the Decision log is ``decisions/service.py``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import orjson

from agent_gateway import errors
from agent_gateway.signatures.identity import SigningIdentity

STATEMENT_TYP = "service-statement+jws"
DECISION_TYP = "service-decision+jws"
MAX_TYP_LENGTH = 128

logger = logging.getLogger(__name__)


def sign_statement(identity: SigningIdentity, statement: str, typ: str = STATEMENT_TYP) -> str:
    """Sign ``{"statement": statement}`` under ``typ`` (spec: POST /sign, route semantics 3).

    Stores and numbers nothing. Logs one line with ``typ`` and the SHA-256 of
    the Statement, never the Statement itself. The caller checks the lengths
    (the HTTP body model does); raises ``AlgorithmMismatch`` when the
    configured algorithm cannot be performed by the key.
    """
    token = identity.sign(orjson.dumps({"statement": statement}), typ)
    logger.info(
        "signed a Statement typ=%r sha256=%s",
        typ,
        hashlib.sha256(statement.encode()).hexdigest(),
    )
    return token


def sign_claims(identity: SigningIdentity, claims: Mapping[str, Any], typ: str = STATEMENT_TYP) -> str:
    """Sign any claims that include a non-empty ``statement`` (spec: Authentication 9, operator-side).

    The payload is the claims' JSON text with members in the mapping's
    order. Raises :class:`errors.InvalidInput` when the claims are not an
    object with a non-empty string ``statement``, when a value is not JSON,
    or when ``typ`` is not 1..128 characters.
    """
    if not isinstance(claims, Mapping):
        raise errors.InvalidInput("claims must be a JSON object")
    statement = claims.get("statement")
    if not isinstance(statement, str) or not statement:
        raise errors.InvalidInput("claims must include statement, a non-empty string")
    check_typ(typ)
    try:
        payload = orjson.dumps(dict(claims))
    except TypeError as exc:
        raise errors.InvalidInput(f"claims must be JSON values: {exc}") from None
    return identity.sign(payload, typ)


def check_typ(typ: Any) -> str:
    """``typ`` when it is a string of 1..128 characters; raises :class:`errors.InvalidInput`."""
    if not isinstance(typ, str) or not 1 <= len(typ) <= MAX_TYP_LENGTH:
        raise errors.InvalidInput(f"typ must be a string of 1 to {MAX_TYP_LENGTH} characters")
    try:
        typ.encode()
    except UnicodeEncodeError:  # a lone surrogate, as an undecodable command-line byte becomes
        raise errors.InvalidInput("typ must be valid Unicode text") from None
    return typ


def verify(identity: SigningIdentity, token: str) -> dict[str, Any]:
    """The answer of POST /verify for ``token`` (spec: route semantics 1, 2).

    ``{"verified": true, "header", "payload"}`` read from the signed bytes
    when ``token`` is a valid artifact of this identity's key and algorithm;
    ``{"verified": false}`` for anything else (another key, any tampering,
    wrong segment count, bad base64url, an unparseable header, another
    algorithm including ``none``). Never raises for a bad artifact.
    """
    verified = identity.verify(token)
    if verified is None:
        return {"verified": False}
    return {"verified": True, "header": verified.header, "payload": verified.payload}
