"""The Decision log over HTTP: POST /decisions, GET /decisions, GET /decisions/{seq} on both servers."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from agent_gateway import clock
from agent_gateway.decisions import service
from agent_gateway.gateway import Gateway

from tests.signatures.helpers import independent_verify, segments

INT32_MAX = 2**31 - 1


async def publish(agent: httpx.AsyncClient, statement: str) -> dict:
    response = await agent.post("/decisions", json={"statement": statement})
    assert response.status_code == 201, response.text
    return response.json()


async def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, (response.request.url, response.text)
    assert set(response.json()) == {"statusCode", "error", "message"}


# --- POST /decisions ----------------------------------------------------------------------


async def test_publish_numbers_stamps_and_signs(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    with clock.use(clock.FrozenClock("2026-11-21T23:03:30.123456Z")):
        decision = await publish(agent, "we ship on Friday")
    assert list(decision) == ["seq", "statement", "jws", "createdAt"]
    assert decision["seq"] == 1 and decision["statement"] == "we ship on Friday"
    assert decision["createdAt"] == "2026-11-21T23:03:30.123Z"
    header, payload, _ = segments(decision["jws"])
    assert orjson.loads(header) == {"alg": "EdDSA", "typ": "service-decision+jws"}
    # Exactly {seq, createdAt, statement}, in that order, and the very createdAt that was stored.
    assert payload == b'{"seq":1,"createdAt":"2026-11-21T23:03:30.123Z","statement":"we ship on Friday"}'
    (jwk,) = gateway.identity.jwks()["keys"]
    assert independent_verify(decision["jws"], jwk)["createdAt"] == decision["createdAt"]
    assert (await agent.get("/decisions/1")).json() == decision


async def test_numbers_follow_each_other_and_timestamps_come_from_the_clock(agent: httpx.AsyncClient) -> None:
    frozen = clock.FrozenClock("2026-01-01T00:00:00Z")
    published = []
    with clock.use(frozen):
        for index in range(3):
            published.append(await publish(agent, f"d{index}"))
            frozen.advance(milliseconds=1)
    assert [d["seq"] for d in published] == [1, 2, 3]
    assert [d["createdAt"] for d in published] == [
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:00:00.001Z",
        "2026-01-01T00:00:00.002Z",
    ]
    for decision in published:
        assert orjson.loads(segments(decision["jws"])[1])["createdAt"] == decision["createdAt"]


async def test_publish_keeps_any_statement(agent: httpx.AsyncClient) -> None:
    # NUL included: PostgreSQL text cannot hold it, so the column holds JSON text.
    for statement in ["\u0000", "a\u0000b", " ", "\U0001f600 \u2028", '"quoted" \\ back', "x" * 200_000]:
        decision = await publish(agent, statement)
        assert decision["statement"] == statement
        assert orjson.loads(segments(decision["jws"])[1])["statement"] == statement
        assert (await agent.get(f"/decisions/{decision['seq']}")).json()["statement"] == statement


async def test_publish_refuses_invalid_bodies_and_stores_nothing(agent: httpx.AsyncClient) -> None:
    for body in [{}, {"statement": ""}, {"statement": None}, {"statement": 5}, {"statement": ["s"]}, {"statement": {}}, [], "s", None]:
        await assert_error(await agent.post("/decisions", json=body), 400)
    assert (await agent.get("/decisions")).json() == {"decisions": []}


async def test_publish_refuses_query_parameters_and_non_json(agent: httpx.AsyncClient) -> None:
    await assert_error(await agent.post("/decisions?seq=5", json={"statement": "s"}), 400)
    await assert_error(await agent.post("/decisions", content=b"s", headers={"content-type": "text/plain"}), 415)
    assert (await agent.get("/decisions")).json() == {"decisions": []}


async def test_publish_ignores_service_assigned_fields(agent: httpx.AsyncClient) -> None:
    body = {"statement": "s", "seq": 99, "createdAt": "2000-01-01T00:00:00.000Z", "jws": "x", "user": "u"}
    response = await agent.post("/decisions", json=body)
    assert response.status_code == 201, response.text
    decision = response.json()
    assert decision["seq"] == 1 and decision["createdAt"] != body["createdAt"] and decision["jws"] != "x"


async def test_concurrent_publishers_never_share_a_number(agent: httpx.AsyncClient) -> None:
    published = await asyncio.gather(*(publish(agent, f"d{index}") for index in range(40)))
    numbers = sorted(decision["seq"] for decision in published)
    assert numbers == list(range(1, 41))
    log = (await agent.get("/decisions?limit=200")).json()["decisions"]
    assert sorted(published, key=lambda d: d["seq"]) == log


async def test_publish_is_not_on_the_public_server(public: httpx.AsyncClient, bearer: dict) -> None:
    await assert_error(await public.post("/decisions", json={"statement": "s"}, headers=bearer), 405)


# --- GET /decisions/{seq} -----------------------------------------------------------------


async def test_get_answers_404_for_a_number_with_no_record(agent: httpx.AsyncClient) -> None:
    await publish(agent, "one")
    for seq in ("2", str(INT32_MAX)):
        await assert_error(await agent.get(f"/decisions/{seq}"), 404)


async def test_get_refuses_a_number_out_of_range(agent: httpx.AsyncClient) -> None:
    await publish(agent, "one")
    for seq in ["0", "-1", str(INT32_MAX + 1), "99999999999", "abc", "01", "1.0", "+1", "1e3", "%201", "%00", "1%00"]:
        await assert_error(await agent.get(f"/decisions/{seq}"), 400)


async def test_get_refuses_query_parameters(agent: httpx.AsyncClient) -> None:
    await publish(agent, "one")
    await assert_error(await agent.get("/decisions/1?limit=1"), 400)


async def test_get_answers_what_the_window_just_below_gives(agent: httpx.AsyncClient) -> None:
    for index in range(5):
        await publish(agent, f"d{index}")
    for seq in range(1, 6):
        one = (await agent.get(f"/decisions/{seq}")).json()
        assert (await agent.get(f"/decisions?before={seq + 1}&limit=1")).json() == {"decisions": [one]}


# --- GET /decisions -----------------------------------------------------------------------


async def test_windows(agent: httpx.AsyncClient) -> None:
    for index in range(7):
        await publish(agent, f"d{index}")

    async def seqs(query: str) -> list[int]:
        response = await agent.get(f"/decisions{query}")
        assert response.status_code == 200, response.text
        return [decision["seq"] for decision in response.json()["decisions"]]

    assert await seqs("") == [1, 2, 3, 4, 5, 6, 7]
    assert await seqs("?limit=3") == [5, 6, 7]  # no cursor: the newest page, ascending
    assert await seqs("?before=5&limit=2") == [3, 4]  # newest page strictly below
    assert await seqs("?before=1") == []
    assert await seqs("?before=0") == []
    assert await seqs("?before=2147483647&limit=1") == [7]
    assert await seqs("?after=0&limit=2") == [1, 2]  # from the beginning
    assert await seqs("?after=5") == [6, 7]
    assert await seqs("?after=7") == []
    assert await seqs(f"?after={INT32_MAX}") == []
    assert await seqs("?limit=1") == [7]
    assert await seqs("?limit=200") == [1, 2, 3, 4, 5, 6, 7]


async def test_the_default_limit_is_50(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    async with gateway.store.transaction() as conn:
        for _ in range(51):
            await service.publish(conn, gateway.identity, "s")
    assert [d["seq"] for d in (await agent.get("/decisions")).json()["decisions"]] == list(range(2, 52))


BAD_WINDOWS = [
        "after=1&before=5",
        "before=1&after=0",
        "limit=0",
        "limit=201",
        "limit=-1",
        "limit=abc",
        "limit=1.5",
        "limit=",
        "after=-1",
        f"after={INT32_MAX + 1}",
        "after=x",
        "after=",
        f"before={INT32_MAX + 1}",
        "before=-1",
        "before=01",
        "after=1&after=2",
        "limit=5&limit=5",
        "user=00000000-0000-4000-8000-000000000000",
        "offset=1",
        "seq=1",
]


async def test_read_refuses_bad_windows(agent: httpx.AsyncClient) -> None:
    for query in BAD_WINDOWS:
        await assert_error(await agent.get(f"/decisions?{query}"), 400)


# --- the Public server ---------------------------------------------------------------------


async def test_public_reads_require_authentication(public: httpx.AsyncClient, agent: httpx.AsyncClient) -> None:
    await publish(agent, "one")
    # No scheme registered: every request is refused.
    await assert_error(await public.get("/decisions"), 401)
    await assert_error(await public.get("/decisions/1"), 401)
    await assert_error(await public.get("/decisions/1", headers={"Authorization": "Bearer test-x"}), 401)


async def test_public_reads_refuse_unknown_bearers(public: httpx.AsyncClient, agent: httpx.AsyncClient, bearer: dict) -> None:
    await publish(agent, "one")
    unknown = {"Authorization": "Bearer test-00000000-0000-4000-8000-000000000000"}
    await assert_error(await public.get("/decisions", headers=unknown), 401)
    await assert_error(await public.get("/decisions/1", headers=unknown), 401)
    await assert_error(await public.get("/decisions/1"), 401)


async def test_public_reads_give_the_same_log(public: httpx.AsyncClient, agent: httpx.AsyncClient, bearer: dict) -> None:
    for index in range(4):
        await publish(agent, f"d{index}")
    for query in ("", "?limit=2", "?before=3", "?after=1&limit=2"):
        mine = await public.get(f"/decisions{query}", headers=bearer)
        assert mine.status_code == 200
        assert mine.json() == (await agent.get(f"/decisions{query}")).json()
    assert (await public.get("/decisions/2", headers=bearer)).json() == (await agent.get("/decisions/2")).json()
    await assert_error(await public.get("/decisions/5", headers=bearer), 404)
    await assert_error(await public.get("/decisions/0", headers=bearer), 400)
    await assert_error(await public.get(f"/decisions/{INT32_MAX + 1}", headers=bearer), 400)


async def test_public_read_refuses_what_the_agent_route_refuses_and_user(public: httpx.AsyncClient, bearer: dict) -> None:
    for query in BAD_WINDOWS:
        await assert_error(await public.get(f"/decisions?{query}", headers=bearer), 400)


async def test_public_get_refuses_query_parameters(public: httpx.AsyncClient, agent: httpx.AsyncClient, bearer: dict) -> None:
    await publish(agent, "one")
    await assert_error(await public.get("/decisions/1?user=x", headers=bearer), 400)


async def test_openapi_documents_the_routes(agent: httpx.AsyncClient, public: httpx.AsyncClient) -> None:
    agent_paths = (await agent.get("/openapi.json")).json()["paths"]
    public_paths = (await public.get("/openapi.json")).json()["paths"]
    assert set(agent_paths["/decisions"]) == {"get", "post"} and "201" in agent_paths["/decisions"]["post"]["responses"]
    assert "404" in agent_paths["/decisions/{seq}"]["get"]["responses"]
    assert "401" in public_paths["/decisions"]["get"]["responses"] and "post" not in public_paths["/decisions"]
    assert {"/jwks.json", "/verify"} <= set(public_paths) and "/sign" in agent_paths
    assert "422" not in str(agent_paths) + str(public_paths)
