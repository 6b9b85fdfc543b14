"""Agent server: ``GET /messages?user=`` and ``POST /messages`` (outbound), on both backends."""

from __future__ import annotations

import uuid

import httpx
import pytest

from agent_gateway.gateway import Gateway

from tests.messages.records import FIELDS, assert_error, bearer, stored_messages, stored_signals

async def send(agent: httpx.AsyncClient, user_id: str, text: str) -> dict:
    response = await agent.post("/messages", json={"userId": user_id, "text": text})
    assert response.status_code == 201, response.text
    return response.json()


# --- POST /messages -------------------------------------------------------------


async def test_post_records_an_outbound_message(agent: httpx.AsyncClient, gateway: Gateway, admit) -> None:
    user_id = await admit()
    response = await agent.post("/messages", json={"userId": user_id, "text": "hello"})
    assert response.status_code == 201
    assert response.headers["content-type"] == "application/json"
    message = response.json()
    assert list(message) == FIELDS
    assert message["userId"] == user_id
    assert message["direction"] == "outbound"
    assert message["seq"] == 1
    assert message["text"] == "hello"
    assert isinstance(message["id"], str) and message["id"]
    assert message["createdAt"].endswith("Z")
    [row] = await stored_messages(gateway.store)
    assert (row["id"], row["seq"], row["direction"], row["created_at"]) == (
        message["id"], 1, "outbound", message["createdAt"],
    )
    assert await stored_signals(gateway.store) == []


async def test_post_numbers_on_from_the_last_message(agent: httpx.AsyncClient, admit) -> None:
    user_id = await admit()
    assert [(await send(agent, user_id, str(n)))["seq"] for n in range(4)] == [1, 2, 3, 4]


@pytest.mark.parametrize("direction", ["inbound", "outbound", 7, None])
async def test_post_strips_direction(agent: httpx.AsyncClient, admit, direction) -> None:
    user_id = await admit()
    response = await agent.post("/messages", json={"userId": user_id, "text": "x", "direction": direction})
    assert response.status_code == 201
    assert response.json()["direction"] == "outbound"


async def test_post_ignores_unknown_fields(agent: httpx.AsyncClient, admit) -> None:
    user_id = await admit()
    body = {"userId": user_id, "text": "x", "seq": 99, "id": "mine", "createdAt": "2000-01-01T00:00:00.000Z"}
    message = (await agent.post("/messages", json=body)).json()
    assert message["seq"] == 1 and message["id"] != "mine" and message["createdAt"] != body["createdAt"]


async def test_user_ids_are_accepted_in_upper_case(agent: httpx.AsyncClient, admit) -> None:
    user_id = await admit()
    message = await send(agent, user_id.upper(), "x")
    assert message["userId"] == user_id
    for spelling in (user_id, user_id.upper()):
        log = (await agent.get("/messages", params={"user": spelling})).json()["messages"]
        assert [m["id"] for m in log] == [message["id"]]


@pytest.mark.parametrize(
    "text",
    [
        "a",
        " ",
        "\n",
        "héllo wörld",
        "👋🏽 family: 👨‍👩‍👧‍👦",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010fffd",
        "שלום עולם",
        "e\u0301 \u200b \u2028 \ufeff",
        "\x01\x1f\x7f",
        "x" * 200_000,
    ],
    ids=["one", "space", "newline", "latin", "emoji", "astral", "rtl", "combining", "controls", "long"],
)
async def test_post_stores_any_text_faithfully(agent: httpx.AsyncClient, admit, text: str) -> None:
    user_id = await admit()
    assert (await send(agent, user_id, text))["text"] == text
    [message] = (await agent.get("/messages", params={"user": user_id})).json()["messages"]
    assert message["text"] == text


@pytest.mark.parametrize(
    "body",
    [
        {"text": "x"},
        {"userId": None, "text": "x"},
        {"userId": 7, "text": "x"},
        {"userId": ["00000000-0000-0000-0000-000000000000"], "text": "x"},
        {"userId": "", "text": "x"},
        {"userId": "nobody", "text": "x"},
        {"userId": "00000000000000000000000000000000", "text": "x"},
        {"userId": "00000000-0000-0000-0000-00000000000g", "text": "x"},
        {"userId": "00000000-0000-0000-0000-000000000000 ", "text": "x"},
        {"userId": "{00000000-0000-0000-0000-000000000000}", "text": "x"},
    ],
    ids=["missing", "null", "number", "array", "empty", "word", "no-dashes", "non-hex", "trailing-space", "braces"],
)
async def test_post_refuses_a_malformed_user_id(agent: httpx.AsyncClient, gateway: Gateway, body) -> None:
    assert_error(await agent.post("/messages", json=body), 400)
    assert await stored_messages(gateway.store) == []


@pytest.mark.parametrize(
    "text",
    [None, "", 7, True, ["x"], {"x": 1}, "a\x00b", "\x00"],
    ids=["null", "empty", "number", "bool", "array", "object", "inner-nul", "nul"],
)
async def test_post_refuses_invalid_text(agent: httpx.AsyncClient, gateway: Gateway, admit, text) -> None:
    user_id = await admit()
    assert_error(await agent.post("/messages", json={"userId": user_id, "text": text}), 400)
    assert await stored_messages(gateway.store) == []


async def test_post_refuses_a_missing_text(agent: httpx.AsyncClient, gateway: Gateway, admit) -> None:
    assert_error(await agent.post("/messages", json={"userId": await admit()}), 400)
    assert await stored_messages(gateway.store) == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'[{"userId": "USER", "text": "x"}]',
        b'"x"',
        b"null",
        b'{"userId": "USER", "text": "x"',
        b'{"userId": "USER", "text": "\xff"}',
        b'{"userId": "USER", "text": NaN}',
        b'{"userId": "USER", "text": "\\ud800"}',
        b'{"userId": "USER", "text": "x"} {}',
    ],
    ids=["empty", "array", "string", "null", "truncated", "invalid-utf8", "nan", "lone-surrogate", "trailing"],
)
async def test_post_refuses_a_body_that_is_not_one_valid_json_object(
    agent: httpx.AsyncClient, gateway: Gateway, admit, content: bytes
) -> None:
    content = content.replace(b"USER", (await admit()).encode())
    response = await agent.post("/messages", content=content, headers={"content-type": "application/json"})
    assert_error(response, 400)
    assert await stored_messages(gateway.store) == []


async def test_post_refuses_a_body_that_is_not_json(agent: httpx.AsyncClient, gateway: Gateway, admit) -> None:
    content = f'{{"userId": "{await admit()}", "text": "x"}}'
    assert_error(await agent.post("/messages", content=content, headers={"content-type": "text/plain"}), 415)
    assert await stored_messages(gateway.store) == []


@pytest.mark.parametrize("query", ["x=1", "user={user}", "userId={user}", "limit=5", "after=0"])
async def test_post_refuses_any_query_parameter(agent: httpx.AsyncClient, gateway: Gateway, admit, query) -> None:
    user_id = await admit()
    response = await agent.post(f"/messages?{query.format(user=user_id)}", json={"userId": user_id, "text": "x"})
    assert_error(response, 400)
    assert await stored_messages(gateway.store) == []


async def test_post_to_a_user_nobody_holds_is_404(agent: httpx.AsyncClient, gateway: Gateway, admit) -> None:
    await admit()
    response = await agent.post("/messages", json={"userId": str(uuid.uuid4()), "text": "x"})
    assert_error(response, 404)
    assert await stored_messages(gateway.store) == []


async def test_post_over_the_body_limit_is_413(agent: httpx.AsyncClient, gateway: Gateway, admit) -> None:
    text = "x" * gateway.settings.max_body_bytes
    assert_error(await agent.post("/messages", json={"userId": await admit(), "text": text}), 413)
    assert await stored_messages(gateway.store) == []


# --- GET /messages?user= ---------------------------------------------------------


async def test_get_reads_both_directions_interleaved(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    user_id = await admit()
    written = []
    for n in range(3):
        inbound = await public.post("/messages", json={"text": f"q{n}"}, headers=bearer(user_id))
        assert inbound.status_code == 201
        written += [inbound.json(), await send(agent, user_id, f"a{n}")]
    response = await agent.get("/messages", params={"user": user_id})
    assert response.status_code == 200
    assert list(response.json()) == ["messages"]
    log = response.json()["messages"]
    assert log == written
    assert [(m["seq"], m["direction"]) for m in log] == [
        (1, "inbound"), (2, "outbound"), (3, "inbound"), (4, "outbound"), (5, "inbound"), (6, "outbound"),
    ]


async def test_get_reads_any_users_log_and_only_that(agent: httpx.AsyncClient, admit) -> None:
    alice, bob = await admit(), await admit()
    await send(agent, alice, "for alice")
    await send(agent, bob, "for bob")
    await send(agent, bob, "for bob again")
    alice_log = (await agent.get("/messages", params={"user": alice})).json()["messages"]
    bob_log = (await agent.get("/messages", params={"user": bob})).json()["messages"]
    assert [(m["seq"], m["text"]) for m in alice_log] == [(1, "for alice")]
    assert [(m["seq"], m["text"]) for m in bob_log] == [(1, "for bob"), (2, "for bob again")]


async def test_get_of_a_user_nobody_holds_is_an_empty_log(agent: httpx.AsyncClient) -> None:
    response = await agent.get("/messages", params={"user": str(uuid.uuid4())})
    assert response.status_code == 200
    assert response.json() == {"messages": []}


async def test_get_cursor_window(agent: httpx.AsyncClient, admit) -> None:
    user_id = await admit()
    for n in range(1, 8):
        await send(agent, user_id, str(n))

    async def seqs(**query: str) -> list[int]:
        response = await agent.get("/messages", params={"user": user_id, **query})
        assert response.status_code == 200, response.text
        return [m["seq"] for m in response.json()["messages"]]

    assert await seqs() == [1, 2, 3, 4, 5, 6, 7]
    assert await seqs(limit="3") == [5, 6, 7]
    assert await seqs(before="5", limit="3") == [2, 3, 4]
    assert await seqs(before="2") == [1]
    assert await seqs(before="1") == []
    assert await seqs(before="0") == []
    assert await seqs(after="0", limit="3") == [1, 2, 3]
    assert await seqs(after="5") == [6, 7]
    assert await seqs(after="7") == []
    assert await seqs(after="2147483647") == []
    assert await seqs(before="2147483647", limit="1") == [7]
    assert await seqs(limit="1") == [7]
    assert await seqs(limit="200") == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "query",
    [
        "",
        "user=",
        "user=nobody",
        "user=00000000000000000000000000000000",
        "user={user}&user={user}",
        "user={user}&after=1&before=5",
        "user={user}&limit=0",
        "user={user}&limit=201",
        "user={user}&limit=abc",
        "user={user}&limit=1.0",
        "user={user}&limit=%2B1",
        "user={user}&limit=01",
        "user={user}&after=-1",
        "user={user}&after=2147483648",
        "user={user}&before=2147483648",
        "user={user}&after=1e3",
        "user={user}&after=",
        "user={user}&userId={user}",
        "user={user}&x=1",
    ],
)
async def test_get_refuses_invalid_queries(agent: httpx.AsyncClient, admit, query: str) -> None:
    user_id = await admit()
    assert_error(await agent.get(f"/messages?{query.format(user=user_id)}"), 400)


async def test_messages_routes_are_described_in_openapi(agent: httpx.AsyncClient) -> None:
    paths = (await agent.get("/openapi.json")).json()["paths"]
    assert set(paths["/messages"]) == {"get", "post"}
    assert {"400", "404", "503"} <= set(paths["/messages"]["post"]["responses"])
