"""POST /sign (Agent), GET /jwks.json and POST /verify (Public)."""

from __future__ import annotations

import hashlib
import hmac
import logging

import httpx
import orjson
import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.http.fastpath import FastPath
from agent_gateway.signatures.routes import fast_sign
from agent_gateway.store.tables import decisions

from tests.signatures.helpers import b64decode, b64encode, independent_verify, segments


async def sign(agent: httpx.AsyncClient, body: dict) -> str:
    response = await agent.post("/sign", json=body)
    assert response.status_code == 200, response.text
    assert list(response.json()) == ["jws"]
    return response.json()["jws"]


async def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, (response.request.url, response.text)
    body = response.json()
    assert set(body) == {"statusCode", "error", "message"} and body["statusCode"] == status


# --- POST /sign ---------------------------------------------------------------------------


async def test_sign_signs_exactly_the_statement(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    jws = await sign(agent, {"statement": "ship it"})
    header, payload, _ = segments(jws)
    assert orjson.loads(header) == {"alg": "EdDSA", "typ": "service-statement+jws"}
    assert payload == b'{"statement":"ship it"}'
    (jwk,) = gateway.identity.jwks()["keys"]
    assert independent_verify(jws, jwk) == {"statement": "ship it"}


async def test_sign_takes_any_typ_of_1_to_128_characters(agent: httpx.AsyncClient, public: httpx.AsyncClient, bearer: dict) -> None:
    for typ in ["a", "x" * 128, "service-decision+jws", "\U0001f600" * 128, "tab\there", "\u0000"]:
        jws = await sign(agent, {"statement": "s", "typ": typ})
        assert orjson.loads(segments(jws)[0])["typ"] == typ
        verified = (await public.post("/verify", json={"jws": jws}, headers=bearer)).json()
        assert verified == {"verified": True, "header": {"alg": "EdDSA", "typ": typ}, "payload": {"statement": "s"}}


async def test_sign_keeps_any_statement_exactly(agent: httpx.AsyncClient, public: httpx.AsyncClient, bearer: dict) -> None:
    for statement in ["\u0000", "émoji \U0001f600 and \u2028", "x" * 300_000, " ", '"\\']:
        jws = await sign(agent, {"statement": statement})
        assert orjson.loads(segments(jws)[1]) == {"statement": statement}
        verified = (await public.post("/verify", json={"jws": jws}, headers=bearer)).json()
        assert verified["verified"] is True and verified["payload"] == {"statement": statement}


INVALID_SIGN_BODIES = [
        {},
        {"statement": ""},
        {"statement": None},
        {"statement": 1},
        {"statement": ["x"]},
        {"statement": {"x": 1}},
        {"statement": True},
        {"statement": "s", "typ": ""},
        {"statement": "s", "typ": "x" * 129},
        {"statement": "s", "typ": "\U0001f600" * 129},
        {"statement": "s", "typ": None},
        {"statement": "s", "typ": 1},
        ["statement"],
        "statement",
        None,
]


async def test_sign_refuses_invalid_bodies(agent: httpx.AsyncClient) -> None:
    for body in INVALID_SIGN_BODIES:
        await assert_error(await agent.post("/sign", json=body), 400)


async def test_sign_refuses_query_parameters_and_non_json(agent: httpx.AsyncClient) -> None:
    await assert_error(await agent.post("/sign?typ=x", json={"statement": "s"}), 400)
    await assert_error(await agent.post("/sign?statement=s", json={"statement": "s"}), 400)
    await assert_error(await agent.post("/sign", content=b"statement=s", headers={"content-type": "text/plain"}), 415)
    await assert_error(await agent.post("/sign", content=b'{"statement": "s"', headers={"content-type": "application/json"}), 400)
    await assert_error(await agent.post("/sign", content=b'{"statement": "\\ud800"}', headers={"content-type": "application/json"}), 400)
    await assert_error(await agent.post("/sign"), 400)


async def test_sign_ignores_other_fields(agent: httpx.AsyncClient) -> None:
    jws = await sign(agent, {"statement": "s", "user": "someone", "seq": 9, "createdAt": "now"})
    assert segments(jws)[1] == b'{"statement":"s"}'


async def test_sign_stores_nothing(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    await sign(agent, {"statement": "s"})
    async with gateway.store.read() as conn:
        assert (await conn.execute(decisions.select())).all() == []
    assert (await agent.get("/decisions")).json() == {"decisions": []}


async def test_sign_logs_typ_and_digest_never_the_statement(agent: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    statement = "a secret plan\nsecond line"
    with caplog.at_level(logging.INFO):
        await sign(agent, {"statement": statement, "typ": "custom+jws"})
    lines = [record for record in caplog.records if "signed a Statement" in record.getMessage()]
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert "custom+jws" in message and hashlib.sha256(statement.encode()).hexdigest() in message
    assert "\n" not in message
    assert all("secret plan" not in record.getMessage() for record in caplog.records)


async def test_the_fast_path_answers_as_the_route_does(agent: httpx.AsyncClient) -> None:
    # An extra field keeps a request off the fast path (the route ignores it); Ed25519 is
    # deterministic, so both answers must be the same bytes.
    fast = await agent.post("/sign", json={"statement": "s", "typ": "t"})
    routed = await agent.post("/sign", json={"statement": "s", "typ": "t", "other": 1})
    assert fast.status_code == routed.status_code == 200
    assert fast.content == routed.content
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert fast.headers["content-length"] == routed.headers["content-length"]


class Inner:
    """The app behind the fast path: records what reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.state: object = None

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call_fast_path(body: bytes, *, query: bytes = b"", content_type: bytes = b"application/json", limit: int = 100):  # type: ignore[no-untyped-def]
    class App:
        class state:
            identity = SigningIdentity(keys.generate_pem("ed25519"))

    inner = Inner()
    inner.state = App.state  # the fast path's handlers find the app's state as routes do
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/sign", "query_string": query, "headers": headers}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await FastPath(inner, limit, {("POST", "/sign"): fast_sign})(scope, receive, send)
    return inner.bodies, sent, App.state.identity


async def test_the_fast_path_signs_a_plainly_valid_request_itself() -> None:
    for body in (b'{"statement":"s"}', b'{"typ":"t","statement":"s"}', b'{"statement":"s","typ":"' + b"x" * 60 + b'"}'):
        reached, sent, identity = await call_fast_path(body)
        assert reached == []
        assert sent[0]["status"] == 200
        jws = orjson.loads(sent[1]["body"])["jws"]
        assert orjson.loads(segments(jws)[1]) == {"statement": "s"}


@pytest.mark.parametrize(
    ("body", "options"),
    [
        (b'{"statement":""}', {}),
        (b'{"statement":1}', {}),
        (b'{"statement":"s","typ":""}', {}),
        (b'{"statement":"s","typ":"' + b"x" * 129 + b'"}', {"limit": 1000}),
        (b'{"statement":"s","other":1}', {}),
        (b'{"typ":"t"}', {}),
    ],
)
async def test_the_fast_path_hands_anything_else_to_the_route_with_its_body(body: bytes, options: dict) -> None:
    reached, sent, _ = await call_fast_path(body, **options)
    assert reached == [body]
    assert sent[0]["status"] == 299


# --- GET /jwks.json -----------------------------------------------------------------------


async def test_jwks_publishes_the_one_public_key_without_authentication(public: httpx.AsyncClient, gateway: Gateway) -> None:
    response = await public.get("/jwks.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert list(document) == ["keys"] and len(document["keys"]) == 1
    (jwk,) = document["keys"]
    assert set(jwk) == {"kty", "crv", "x"} and jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
    pem = gateway.settings.signing_key_file.read_bytes()
    assert document == SigningIdentity(pem).jwks()


async def test_jwks_refuses_query_parameters(public: httpx.AsyncClient) -> None:
    await assert_error(await public.get("/jwks.json?kid=1"), 400)


async def test_jwks_is_not_on_the_agent_server_and_sign_not_on_the_public_one(agent: httpx.AsyncClient, public: httpx.AsyncClient) -> None:
    await assert_error(await agent.get("/jwks.json"), 404)
    await assert_error(await public.post("/sign", json={"statement": "s"}), 404)


# --- POST /verify -------------------------------------------------------------------------


async def test_verify_requires_authentication(public: httpx.AsyncClient, agent: httpx.AsyncClient) -> None:
    jws = await sign(agent, {"statement": "s"})
    # No scheme registered: every request is refused, whatever it carries.
    await assert_error(await public.post("/verify", json={"jws": jws}), 401)
    await assert_error(await public.post("/verify", json={"jws": jws}, headers={"Authorization": "Bearer test-x"}), 401)


async def test_verify_refuses_unknown_bearers(public: httpx.AsyncClient, agent: httpx.AsyncClient, bearer: dict) -> None:
    jws = await sign(agent, {"statement": "s"})
    unknown = {"Authorization": "Bearer test-00000000-0000-4000-8000-000000000000"}
    await assert_error(await public.post("/verify", json={"jws": jws}, headers=unknown), 401)
    await assert_error(await public.post("/verify", json={"jws": jws}), 401)
    assert (await public.post("/verify", json={"jws": jws}, headers=bearer)).json()["verified"] is True


async def test_verify_reads_header_and_payload_from_the_signed_bytes(public: httpx.AsyncClient, agent: httpx.AsyncClient, bearer: dict) -> None:
    jws = await sign(agent, {"statement": "s", "typ": "mine+jws"})
    response = await public.post("/verify", json={"jws": jws}, headers=bearer)
    assert response.status_code == 200
    assert response.json() == {"verified": True, "header": {"alg": "EdDSA", "typ": "mine+jws"}, "payload": {"statement": "s"}}
    decision = (await agent.post("/decisions", json={"statement": "d"})).json()
    response = await public.post("/verify", json={"jws": decision["jws"]}, headers=bearer)
    assert response.json() == {
        "verified": True,
        "header": {"alg": "EdDSA", "typ": "service-decision+jws"},
        "payload": {"seq": decision["seq"], "createdAt": decision["createdAt"], "statement": "d"},
    }


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _replace(jws: str, index: int, segment: str) -> str:
    parts = jws.split(".")
    parts[index] = segment
    return ".".join(parts)


def _flip(segment: str, position: int) -> str:
    """``segment`` with one character changed to another of the base64url alphabet, changing its bits."""
    replacement = "A" if segment[position] != "A" else "B"
    return segment[:position] + replacement + segment[position + 1 :]


def _not_verified_cases(jws: str, identity: SigningIdentity) -> dict[str, str]:
    header, payload, signature = jws.split(".")
    other = SigningIdentity(keys.generate_pem("ed25519"))
    other_p256 = SigningIdentity(keys.generate_pem("p256"))
    public_jwk = orjson.dumps(identity.jwks()["keys"][0])
    hs256_header = b64encode(b'{"alg":"HS256","typ":"service-statement+jws"}')
    hs256_signature = b64encode(hmac.new(public_jwk, f"{hs256_header}.{payload}".encode(), hashlib.sha256).digest())
    # The last character of an Ed25519 signature carries 2 bits and 4 unused ones: same bytes, other text.
    same_bytes = signature[:-1] + ALPHABET[ALPHABET.index(signature[-1]) | 1]
    assert b64decode(same_bytes) == b64decode(signature) and same_bytes != signature
    none_header = b64encode(b'{"alg":"none"}')
    impossible_length = payload + "A" * ((1 - len(payload)) % 4)  # 4n+1 characters decode to nothing
    return {
        "another key's artifact": other.sign(b64decode(payload), "service-statement+jws"),
        "another key type's artifact": other_p256.sign(b64decode(payload), "service-statement+jws"),
        "tampered header": _replace(jws, 0, b64encode(b'{"alg":"EdDSA","typ":"service-decision+jws"}')),
        "tampered payload": _replace(jws, 1, b64encode(b'{"statement":"t"}')),
        "tampered payload bit": _replace(jws, 1, _flip(payload, 3)),
        "tampered signature": _replace(jws, 2, _flip(signature, 10)),
        "signature of other bytes": _replace(jws, 2, other.sign(b"x", "t").split(".")[2]),
        "signature re-encoded with unused bits set": _replace(jws, 2, same_bytes),
        "signature with padding": jws + "==",
        "truncated signature": jws[:-4],
        "empty signature": f"{header}.{payload}.",
        "two segments": f"{header}.{payload}",
        "four segments": jws + "." + signature,
        "one segment": header,
        "only dots": "..",
        "bad base64url header": _replace(jws, 0, "!!!" + header),
        "bad base64url payload": _replace(jws, 1, payload + "*"),
        "standard base64 alphabet": jws.replace("-", "+").replace("_", "/") if ("-" in jws or "_" in jws) else "+" + jws,
        "impossible base64 length": _replace(jws, 1, impossible_length),
        "unparseable header": _replace(jws, 0, b64encode(b"not json")),
        "header is an array": _replace(jws, 0, b64encode(b'["alg","EdDSA"]')),
        "header is a string": _replace(jws, 0, b64encode(b'"alg b64"')),
        "header is a number": _replace(jws, 0, b64encode(b"1")),
        "header without alg": _replace(jws, 0, b64encode(b'{"typ":"x"}')),
        "header with invalid utf-8": _replace(jws, 0, b64encode(b'{"alg":"EdDSA","typ":"\xff"}')),
        "header with bad crit": _replace(jws, 0, b64encode(b'{"alg":"EdDSA","crit":[["x"]]}')),
        "header with b64 false": _replace(jws, 0, b64encode(b'{"alg":"EdDSA","b64":false,"crit":["b64"]}')),
        "alg none": f"{none_header}.{payload}.",
        "alg none with the signature": _replace(jws, 0, b64encode(b'{"alg":"none","typ":"service-statement+jws"}')),
        "alg HS256 keyed with the public key": f"{hs256_header}.{payload}.{hs256_signature}",
        "alg ES256 on an Ed25519 key": _replace(jws, 0, b64encode(b'{"alg":"ES256","typ":"service-statement+jws"}')),
        "alg Ed25519 (RFC 9864 name)": _replace(jws, 0, b64encode(b'{"alg":"Ed25519","typ":"service-statement+jws"}')),
        "non-ascii": jws + "\u00e9",
        "whitespace": " " + jws,
        "nul": jws + "\u0000",
        "not a jws at all": "hello",
    }


async def test_verify_answers_false_never_an_error(public: httpx.AsyncClient, agent: httpx.AsyncClient, gateway: Gateway, bearer: dict) -> None:
    jws = await sign(agent, {"statement": "s"})
    cases = _not_verified_cases(jws, gateway.identity)
    assert len(cases) > 30
    for case, artifact in cases.items():
        response = await public.post("/verify", json={"jws": artifact}, headers=bearer)
        assert response.status_code == 200, (case, response.text)
        assert response.json() == {"verified": False}, case
    # The untouched artifact still verifies: the cases above fail for what was done to them.
    assert (await public.post("/verify", json={"jws": jws}, headers=bearer)).json()["verified"] is True


async def test_verify_refuses_invalid_bodies(public: httpx.AsyncClient, bearer: dict) -> None:
    for body in [{}, {"jws": ""}, {"jws": None}, {"jws": 1}, {"jws": ["a.b.c"]}, [], "a.b.c"]:
        await assert_error(await public.post("/verify", json=body, headers=bearer), 400)


async def test_verify_refuses_query_parameters(public: httpx.AsyncClient, bearer: dict) -> None:
    await assert_error(await public.post("/verify?jws=a.b.c", json={"jws": "a.b.c"}, headers=bearer), 400)


async def test_verify_is_not_on_the_agent_server(agent: httpx.AsyncClient) -> None:
    await assert_error(await agent.post("/verify", json={"jws": "a.b.c"}), 404)
