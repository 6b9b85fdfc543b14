"""Agent routes GET /signals, /signals/{id}, /runs, /runs/{id} (spec: Agent server)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from agent_gateway import clock
from agent_gateway.gateway import Gateway
from agent_gateway.signals import service
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries

from tests.signals.conftest import emit

PAYLOADS = [
    {"b": 1, "a": [1.5, None, True, "ü"]},
    [3, 2, 1],
    "just a string",
    12345678901234567890,
    None,
    {"nested": {"z": {}, "y": []}, "text": "line\nbreak \u0000 nul"},
]


async def test_signal_payloads_read_back_exactly_as_written(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    ids = [await emit(gateway.store, f"kind.{n}", payload) for n, payload in enumerate(PAYLOADS)]
    for signal_id, payload in zip(ids, PAYLOADS):
        response = await agent.get(f"/signals/{signal_id}")
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"id", "kind", "payload", "emittedAt", "state", "error"}
        assert body["id"] == signal_id
        assert body["payload"] == payload
        assert body["state"] in ("pending", "processing", "failed")
    # Key order, too: the payload is stored as written, not re-sorted.
    text = (await agent.get(f"/signals/{ids[0]}")).text
    assert '"payload":{"b":1,"a":[1.5,null,true,"ü"]}' in text


async def _record(gateway: Gateway, kind: str, emitted_at: str, runs: list[str | None] = ()) -> str:  # type: ignore[assignment]
    """A Signal and its Runs written directly, so no worker moves them (they have no Handler)."""
    signal_id = str(uuid.uuid4())
    async with gateway.store.transaction() as conn:
        await signal_queries.insert(conn, id=signal_id, kind=kind, payload={"k": kind}, emitted_at=emitted_at)
        recorded = await run_queries.record(
            conn, signal_id=signal_id, prompts=[(str(uuid.uuid4()), f"s{n}", "p") for n in range(len(runs))]
        )
        for run, started_at in zip(recorded, runs):
            if started_at is not None:
                await run_queries.start(conn, id=run.id, started_at=started_at)
    return signal_id


async def test_signals_list_newest_first_with_kind_filter_and_limit(
    idle_gateway: Gateway, agent: httpx.AsyncClient
) -> None:
    a = await _record(idle_gateway, "a", "2026-01-01T00:00:02.000Z")
    b = await _record(idle_gateway, "b", "2026-01-01T00:00:01.000Z")
    c = await _record(idle_gateway, "a", "2026-01-01T00:00:03.000Z")
    d = await _record(idle_gateway, "a", "2026-01-01T00:00:03.000Z")  # a tie: the later emission is newer

    body = (await agent.get("/signals")).json()
    assert list(body) == ["signals"]
    assert [s["id"] for s in body["signals"]] == [d, c, a, b]
    assert [s["id"] for s in (await agent.get("/signals", params={"kind": "a"})).json()["signals"]] == [d, c, a]
    assert (await agent.get("/signals", params={"kind": "none"})).json() == {"signals": []}
    assert (await agent.get("/signals", params={"kind": ""})).json() == {"signals": []}
    limited = await agent.get("/signals", params={"limit": "2", "kind": "a"})
    assert [s["id"] for s in limited.json()["signals"]] == [d, c]
    assert [s["id"] for s in (await agent.get("/signals", params={"limit": "1"})).json()["signals"]] == [d]


async def test_list_limits_at_and_past_the_edges(idle_gateway: Gateway, agent: httpx.AsyncClient) -> None:
    async with idle_gateway.store.transaction() as conn:
        for _ in range(201):
            await service.emit(conn, "many", None)
    for path in ("/signals", "/runs"):
        for bad in ("0", "201", "-1", "1.0", "01", "abc", ""):
            response = await agent.get(path, params={"limit": bad})
            assert response.status_code == 400, (path, bad)
            assert set(response.json()) == {"statusCode", "error", "message"}
    assert len((await agent.get("/signals")).json()["signals"]) == 50
    assert len((await agent.get("/signals", params={"limit": "200"})).json()["signals"]) == 200
    assert len((await agent.get("/signals", params={"limit": "1"})).json()["signals"]) == 1


async def test_runs_list_newest_first_by_start_not_started_first(idle_gateway: Gateway, agent: httpx.AsyncClient) -> None:
    first = await _record(idle_gateway, "x", "2026-01-01T00:00:00.000Z", ["2026-01-01T00:01:00.000Z", None])
    second = await _record(idle_gateway, "x", "2026-01-01T00:00:01.000Z", ["2026-01-01T00:03:00.000Z", None])
    third = await _record(idle_gateway, "x", "2026-01-01T00:00:02.000Z", ["2026-01-01T00:02:00.000Z"])

    runs = (await agent.get("/runs")).json()["runs"]
    assert [(r["signalId"], r["startedAt"]) for r in runs] == [
        (second, None),  # not started: first, the most recently recorded first
        (first, None),
        (second, "2026-01-01T00:03:00.000Z"),
        (third, "2026-01-01T00:02:00.000Z"),
        (first, "2026-01-01T00:01:00.000Z"),
    ]
    assert set(runs[0]) == {"id", "signalId", "session", "prompt", "state", "error", "startedAt", "endedAt"}
    assert (runs[0]["state"], runs[2]["state"]) == ("pending", "running")

    of_first = (await agent.get("/runs", params={"signalId": first.upper()})).json()["runs"]
    assert [(r["signalId"], r["startedAt"]) for r in of_first] == [(first, None), (first, "2026-01-01T00:01:00.000Z")]
    nobody = (await agent.get("/runs", params={"signalId": str(uuid.uuid4())})).json()
    assert nobody == {"runs": []}
    assert len((await agent.get("/runs", params={"limit": "2"})).json()["runs"]) == 2


async def test_reads_of_one_record(idle_gateway: Gateway, agent: httpx.AsyncClient) -> None:
    signal_id = await _record(idle_gateway, "x", "2026-01-01T00:00:00.000Z", ["2026-01-01T00:01:00.000Z"])
    [run] = (await agent.get("/runs", params={"signalId": signal_id})).json()["runs"]
    assert (await agent.get(f"/runs/{run['id']}")).json() == run
    assert (await agent.get(f"/runs/{run['id'].upper()}")).json() == run
    assert (await agent.get(f"/signals/{signal_id.upper()}")).json()["id"] == signal_id
    assert run == {
        "id": run["id"],
        "signalId": signal_id,
        "session": "s0",
        "prompt": "p",
        "state": "running",
        "error": None,
        "startedAt": "2026-01-01T00:01:00.000Z",
        "endedAt": None,
    }


@pytest.mark.parametrize("path", ["/signals/{}", "/runs/{}"])
async def test_unknown_ids_are_404_and_malformed_ids_400(
    idle_gateway: Gateway, agent: httpx.AsyncClient, path: str
) -> None:
    response = await agent.get(path.format(uuid.uuid4()))
    assert response.status_code == 404
    assert response.json()["statusCode"] == 404
    for bad in ("not-a-uuid", "1234", "0b7c5e4e52c34a83a7a40ad3c1b8f7a2", "0b7c5e4e-52c3-4a83-a7a4-0ad3c1b8f7a2x", "%00"):
        response = await agent.get(path.format(bad))
        assert response.status_code == 400, bad
        assert response.json()["statusCode"] == 400


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/signals", {"signalId": str(uuid.uuid4())}),
        ("/signals", {"after": "1"}),
        ("/runs", {"kind": "x"}),
        ("/runs", {"signalId": "nope"}),
        ("/runs", {"signalId": ""}),
        ("/signals/{signal}", {"limit": "1"}),
        ("/runs/{run}", {"x": "1"}),
        ("/signals", {"kind": "a\x00b"}),
    ],
)
async def test_bad_query_parameters_are_400(
    idle_gateway: Gateway, agent: httpx.AsyncClient, path: str, params: dict[str, str]
) -> None:
    signal_id = await _record(idle_gateway, "x", clock.now_iso(), ["2026-01-01T00:01:00.000Z"])
    [run] = (await agent.get("/runs")).json()["runs"]
    response = await agent.get(path.format(signal=signal_id, run=run["id"]), params=params)
    assert response.status_code == 400
    assert set(response.json()) == {"statusCode", "error", "message"}


async def test_a_query_parameter_given_twice_is_400(idle_gateway: Gateway, agent: httpx.AsyncClient) -> None:
    assert (await agent.get("/signals?kind=a&kind=b")).status_code == 400
    assert (await agent.get("/runs?limit=1&limit=1")).status_code == 400


async def test_the_routes_are_in_the_agent_servers_openapi(agent: httpx.AsyncClient, public: httpx.AsyncClient) -> None:
    paths = (await agent.get("/openapi.json")).json()["paths"]
    assert {"/signals", "/signals/{id}", "/runs", "/runs/{id}"} <= set(paths)
    assert "/signals" not in (await public.get("/openapi.json")).json()["paths"]
    assert (await public.get("/signals")).status_code == 404
