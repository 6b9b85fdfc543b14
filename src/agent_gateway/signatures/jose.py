"""joserfc, configured once for this gateway: the algorithm registry and compact verification.

Everything cryptographic is joserfc's (on ``cryptography``); this module only
chooses what joserfc is allowed to accept. A verification answers ``None``
for anything that is not a valid artifact of the given key, whatever is
wrong with it, so callers can turn every failure into ``verified: false``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Collection
from typing import Any, ClassVar

import orjson
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import Key
from joserfc.util import urlsafe_b64decode

# Names joserfc knows that are no public-key signature: "none" and the HMAC
# family never verify anything against a published public key.
_UNUSABLE = frozenset({"none", "HS256", "HS384", "HS512"})


class Registry(jws.JWSRegistry):
    """joserfc's JWS registry without its size caps and without the EdDSA warning.

    The spec names the algorithm of an Ed25519 key ``EdDSA``; joserfc warns on
    every use of that name since RFC 9864 (which prefers ``Ed25519``), so this
    registry holds a copy of the algorithm without the warning. The caps
    (512-byte header, 128 kB payload) would refuse the service's own
    artifacts: a Statement has no maximum length of the service's own, and
    the HTTP body limit already bounds what a request can carry.
    """

    algorithms: ClassVar[dict[str, jws.JWSAlgModel]] = {
        name: copy.copy(alg) for name, alg in jws.JWSRegistry.algorithms.items() if name not in _UNUSABLE
    }
    for _alg in algorithms.values():
        _alg.security_warning = None
    del _alg

    max_header_length = math.inf  # type: ignore[assignment]
    max_payload_length = math.inf  # type: ignore[assignment]
    max_signature_length = math.inf  # type: ignore[assignment]

    def __init__(self, algorithms: Collection[str]) -> None:
        # joserfc reads an empty list as "every recommended algorithm"; here it would be a bug.
        if not algorithms:
            raise ValueError("a verification registry needs at least one algorithm")
        super().__init__(algorithms=list(algorithms))


def algorithm(name: str) -> jws.JWSAlgModel:
    """The JWS algorithm called ``name``; raises KeyError for a name this gateway cannot sign with."""
    return Registry.algorithms[name]


def compatible_algorithms(key: Key) -> list[str]:
    """Every signature algorithm ``key`` can verify (RSA keys have several)."""
    return [alg.name for alg in Registry.filter_algorithms(key, list(Registry.algorithms))]


@dataclasses.dataclass(frozen=True)
class Verified:
    """A valid artifact: its protected header and payload, read from the signed bytes."""

    header: dict[str, Any]
    payload: Any


def verify_compact(token: str, key: Key, registry: Registry) -> Verified | None:
    """Check a compact JWS against ``key`` with the algorithms of ``registry``; None when not valid.

    The header's ``alg`` must be one the registry allows (so ``none`` and any
    algorithm other than the key's fail) and the header must be a JSON object.
    Base64url is decoded strictly by joserfc, so a signature re-encoded with
    padding or with different unused bits is refused, not accepted as equal.
    The payload must be JSON: everything this gateway signs is.
    """
    try:
        raw = token.encode("ascii")
    except UnicodeEncodeError:
        return None
    try:
        obj = jws.extract_compact(raw, registry=registry)
        # joserfc checks that "alg" is in the header but not that the header is an object.
        if not isinstance(obj.protected, dict) or obj.protected.get("alg") not in registry.allowed:
            return None
        if not jws.validate_compact(obj, key, registry=registry):
            return None
        # The answer is read from the signed bytes themselves, with the same strict
        # parser as request bodies (joserfc's json.loads accepts NaN and lone surrogates).
        header = orjson.loads(urlsafe_b64decode(obj.segments["header"]))
        payload = orjson.loads(obj.payload)
    except (JoseError, ValueError, TypeError):
        return None
    return Verified(header, payload)
