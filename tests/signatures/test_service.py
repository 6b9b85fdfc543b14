"""The operator-side signing API (spec: Authentication 9, "sign claims")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent_gateway import errors
from agent_gateway.signatures import keys, service
from agent_gateway.signatures.identity import SigningIdentity

from tests.signatures.helpers import segments

identity = SigningIdentity(keys.generate_pem("ed25519"))


def test_sign_claims_keeps_the_members_in_the_order_given() -> None:
    jws = service.sign_claims(identity, {"b": 2, "statement": "s", "a": [1, {"y": None, "x": True}]})
    header, payload, _ = segments(jws)
    assert orjson.loads(header) == {"alg": "EdDSA", "typ": "service-statement+jws"}
    assert payload == b'{"b":2,"statement":"s","a":[1,{"y":null,"x":true}]}'
    verified = identity.verify(jws)
    assert verified is not None and list(verified.payload) == ["b", "statement", "a"]


def test_sign_claims_takes_a_typ() -> None:
    for typ in ("a", "x" * 128, "service-decision+jws"):
        assert orjson.loads(segments(service.sign_claims(identity, {"statement": "s"}, typ))[0])["typ"] == typ


@pytest.mark.parametrize(
    ("claims", "typ"),
    [
        ({}, "t"),
        ({"statement": ""}, "t"),
        ({"statement": 1}, "t"),
        ({"statement": None}, "t"),
        (["statement"], "t"),
        ("statement", "t"),
        (None, "t"),
        ({"statement": "s", "other": object()}, "t"),
        ({"statement": "s", 1: "non-string key"}, "t"),
        ({"statement": "s"}, ""),
        ({"statement": "s"}, "x" * 129),
        ({"statement": "s"}, None),
        ({"statement": "s"}, "\udcff"),
        ({"statement": "\ud800"}, "t"),
    ],
)
def test_sign_claims_refuses_what_is_not_claims(claims: Any, typ: Any) -> None:
    with pytest.raises(errors.InvalidInput):
        service.sign_claims(identity, claims, typ)


def test_sign_statement_payload_is_exactly_the_statement() -> None:
    assert segments(service.sign_statement(identity, "x"))[1] == b'{"statement":"x"}'


def test_verify_answers_false_with_nothing_else() -> None:
    assert service.verify(identity, "a.b.c") == {"verified": False}
    jws = service.sign_statement(identity, "x", "t")
    assert service.verify(identity, jws) == {"verified": True, "header": {"alg": "EdDSA", "typ": "t"}, "payload": {"statement": "x"}}
