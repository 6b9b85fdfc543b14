"""Public server: ``GET /messages`` and ``POST /messages`` (inbound) of the authenticated User."""

from __future__ import annotations

import uuid

import httpx
import pytest

from agent_gateway.gateway import Gateway

from tests.messages.records import FIELDS, assert_error, bearer, stored_messages, stored_signals


async def receive(public: httpx.AsyncClient, user_id: str, text: str) -> dict:
    response = await public.post("/messages", json={"text": text}, headers=bearer(user_id))
    assert response.status_code == 201, response.text
    return response.json()


# --- authentication ----------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_with_no_scheme_registered_every_request_is_401(
    public: httpx.AsyncClient, gateway: Gateway, admit, method: str
) -> None:
    gateway.auth_schemes.clear()  # whatever schemes the gateway registers by default
    user_id = await admit()
    response = await public.request(method, "/messages", json={"text": "x"}, headers=bearer(user_id))
    assert_error(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"
    assert await stored_messages(gateway.store) == []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer test-"},
        {"Authorization": "Basic dGVzdDp0ZXN0"},
        {"Authorization": "Bearer test-00000000-0000-0000-0000-000000000000"},
    ],
    ids=["none", "empty", "no-user", "basic", "nobody"],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_unauthenticated_requests_are_401(
    public: httpx.AsyncClient, authenticating: Gateway, admit, method: str, headers: dict
) -> None:
    await admit()
    response = await public.request(method, "/messages", json={"text": "x"}, headers=headers)
    assert_error(response, 401)
    assert response.json()["message"] == "authentication failed"
    assert await stored_messages(authenticating.store) == []
    assert await stored_signals(authenticating.store) == []


async def test_an_unauthenticated_invalid_post_is_401(public: httpx.AsyncClient, authenticating: Gateway) -> None:
    assert_error(await public.post("/messages", json={"text": ""}), 401)


# --- POST /messages --------------------------------------------------------------


async def test_post_records_an_inbound_message_and_its_signal(
    public: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    user_id = await admit()
    response = await public.post("/messages", json={"text": "hello agent"}, headers=bearer(user_id))
    assert response.status_code == 201
    message = response.json()
    assert list(message) == FIELDS
    assert (message["userId"], message["direction"], message["seq"], message["text"]) == (
        user_id, "inbound", 1, "hello agent",
    )
    [row] = await stored_messages(authenticating.store)
    assert row["id"] == message["id"]
    [signal] = await stored_signals(authenticating.store)
    assert signal["kind"] == "message.received"
    assert signal["payload"] == message


async def test_each_inbound_message_has_exactly_one_signal(
    public: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    user_id = await admit()
    written = [await receive(public, user_id, f"m{n}") for n in range(3)]
    assert [s["payload"] for s in await stored_signals(authenticating.store)] == written


@pytest.mark.parametrize("user_field", ["other", "nobody", "malformed", "number", "null"])
async def test_post_strips_user_id(public: httpx.AsyncClient, authenticating: Gateway, admit, user_field) -> None:
    alice, bob = await admit(), await admit()
    user_id = {"other": bob, "nobody": str(uuid.uuid4()), "malformed": "x", "number": 7, "null": None}[user_field]
    response = await public.post("/messages", json={"text": "x", "userId": user_id}, headers=bearer(alice))
    assert response.status_code == 201
    assert response.json()["userId"] == alice
    assert {row["user_id"] for row in await stored_messages(authenticating.store)} == {alice}


@pytest.mark.parametrize("direction", ["outbound", "inbound", 1])
async def test_post_direction_field_has_no_effect(
    public: httpx.AsyncClient, authenticating: Gateway, admit, direction
) -> None:
    user_id = await admit()
    response = await public.post("/messages", json={"text": "x", "direction": direction}, headers=bearer(user_id))
    assert response.status_code == 201
    assert response.json()["direction"] == "inbound"


@pytest.mark.parametrize("text", ["ok 👍", "\U0001f600" * 3, "שלום", " ", "x" * 100_000])
async def test_post_stores_any_text_faithfully(
    public: httpx.AsyncClient, authenticating: Gateway, admit, text: str
) -> None:
    user_id = await admit()
    assert (await receive(public, user_id, text))["text"] == text
    [signal] = await stored_signals(authenticating.store)
    assert signal["payload"]["text"] == text
    [message] = (await public.get("/messages", headers=bearer(user_id))).json()["messages"]
    assert message["text"] == text


@pytest.mark.parametrize(
    "body",
    [{}, {"text": None}, {"text": ""}, {"text": 1}, {"text": ["x"]}, {"text": "a\x00"}, {"text": False}],
    ids=["missing", "null", "empty", "number", "array", "nul", "bool"],
)
async def test_post_refuses_invalid_text(public: httpx.AsyncClient, authenticating: Gateway, admit, body) -> None:
    user_id = await admit()
    assert_error(await public.post("/messages", json=body, headers=bearer(user_id)), 400)
    assert await stored_messages(authenticating.store) == []
    assert await stored_signals(authenticating.store) == []


@pytest.mark.parametrize(
    "content",
    [b"", b'[{"text": "x"}]', b'{"text": "x"', b'{"text": "\xc3"}', b'{"text": "\\udfff"}'],
    ids=["empty", "array", "truncated", "invalid-utf8", "lone-surrogate"],
)
async def test_post_refuses_a_body_that_is_not_a_json_object(
    public: httpx.AsyncClient, authenticating: Gateway, admit, content: bytes
) -> None:
    headers = {**bearer(await admit()), "content-type": "application/json"}
    assert_error(await public.post("/messages", content=content, headers=headers), 400)
    assert await stored_messages(authenticating.store) == []


async def test_post_refuses_a_body_that_is_not_json(public: httpx.AsyncClient, authenticating: Gateway, admit) -> None:
    headers = {**bearer(await admit()), "content-type": "text/plain"}
    assert_error(await public.post("/messages", content=b'{"text": "x"}', headers=headers), 415)
    assert await stored_messages(authenticating.store) == []


@pytest.mark.parametrize("query", ["user={user}", "userId={user}", "x=1", "after=0"])
async def test_post_refuses_any_query_parameter(
    public: httpx.AsyncClient, authenticating: Gateway, admit, query: str
) -> None:
    user_id = await admit()
    response = await public.post(f"/messages?{query.format(user=user_id)}", json={"text": "x"}, headers=bearer(user_id))
    assert_error(response, 400)
    assert await stored_messages(authenticating.store) == []
    assert await stored_signals(authenticating.store) == []


# --- GET /messages ----------------------------------------------------------------


async def test_get_reads_only_the_authenticated_users_log(
    public: httpx.AsyncClient, agent: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    alice, bob = await admit(), await admit()
    await receive(public, alice, "alice 1")
    await receive(public, bob, "bob 1")
    answer = await agent.post("/messages", json={"userId": alice, "text": "to alice"})
    await receive(public, bob, "bob 2")
    alice_log = (await public.get("/messages", headers=bearer(alice))).json()
    bob_log = (await public.get("/messages", headers=bearer(bob))).json()
    assert list(alice_log) == ["messages"]
    assert [(m["seq"], m["direction"], m["text"]) for m in alice_log["messages"]] == [
        (1, "inbound", "alice 1"), (2, "outbound", "to alice"),
    ]
    assert alice_log["messages"][1] == answer.json()
    assert [(m["seq"], m["text"]) for m in bob_log["messages"]] == [(1, "bob 1"), (2, "bob 2")]
    assert {m["userId"] for m in bob_log["messages"]} == {bob}


async def test_get_of_an_empty_log(public: httpx.AsyncClient, authenticating: Gateway, admit) -> None:
    response = await public.get("/messages", headers=bearer(await admit()))
    assert response.status_code == 200
    assert response.json() == {"messages": []}


async def test_polling_for_the_answer_with_after(
    public: httpx.AsyncClient, agent: httpx.AsyncClient, authenticating: Gateway, admit
) -> None:
    user_id = await admit()
    sent = await receive(public, user_id, "what time is it?")
    poll = {"after": str(sent["seq"])}
    assert (await public.get("/messages", params=poll, headers=bearer(user_id))).json() == {"messages": []}
    answer = (await agent.post("/messages", json={"userId": user_id, "text": "noon"})).json()
    assert (await public.get("/messages", params=poll, headers=bearer(user_id))).json() == {"messages": [answer]}


async def test_get_cursor_window(public: httpx.AsyncClient, authenticating: Gateway, admit) -> None:
    user_id = await admit()
    for n in range(5):
        await receive(public, user_id, str(n))

    async def seqs(**query: str) -> list[int]:
        response = await public.get("/messages", params=query, headers=bearer(user_id))
        assert response.status_code == 200, response.text
        return [m["seq"] for m in response.json()["messages"]]

    assert await seqs(limit="2") == [4, 5]
    assert await seqs(before="4", limit="2") == [2, 3]
    assert await seqs(after="0", limit="2") == [1, 2]
    assert await seqs(after="3") == [4, 5]
    assert await seqs(limit="200", after="2147483647") == []


@pytest.mark.parametrize(
    "query",
    [
        "user={user}",
        "userId={user}",
        "x=1",
        "after=1&before=3",
        "limit=201",
        "limit=0",
        "after=2147483648",
        "before=-1",
        "after=1&after=2",
        "limit=ten",
    ],
)
async def test_get_refuses_invalid_queries(
    public: httpx.AsyncClient, authenticating: Gateway, admit, query: str
) -> None:
    user_id = await admit()
    assert_error(await public.get(f"/messages?{query.format(user=user_id)}", headers=bearer(user_id)), 400)
