"""The fast path (http.fastpath): it answers exactly what the routes answer, or hands the request on.

Each fast twin is declared on its route's router (``http.app.Router.fast``),
and each server runs the twins of the routers it includes, none twice.

A request the fast path hands on reaches the FastAPI route with its body. The
comparisons below send each request twice: once plainly (the fast path takes
it) and once in a form the fast path does not take but the route reads the
same way (``Content-Type: application/json; charset=utf-8`` for a POST, a
stray ``&`` in a query), so the route's own answer is the reference.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
import uuid
from typing import Any

import httpx
import orjson
import pytest
from starlette.routing import Match

import agent_gateway
from agent_gateway import clock, config, errors
from agent_gateway.auth import service as auth
from agent_gateway.gateway import Gateway
from agent_gateway.http.app import Router, fast_routes, router
from agent_gateway.http.fastpath import FastPath
from agent_gateway.signals import service as signals
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.users import service as users
from tests.signals.conftest import until

ROUTED_JSON = {"Content-Type": "application/json; charset=utf-8"}


# --- the middleware, with a stand-in app behind it ----------------------------------


class Inner:
    """The app behind the fast path: records the bodies that reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        message = await receive()
        self.bodies.append(message.get("body", b""))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(handler, method: str, body: bytes = b"", *, query: bytes = b"", content_type: bytes = b"application/json", limit: int = 100):  # type: ignore[no-untyped-def]
    inner = Inner()
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": method, "path": "/r", "query_string": query, "headers": headers}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await FastPath(inner, limit, {(method, "/r"): handler})(scope, receive, send)
    return inner.bodies, sent


async def echo(scope: Any, data: dict[str, Any]) -> tuple[int, bytes]:
    return 200, orjson.dumps(data)


async def test_a_plain_post_gets_its_json_object_and_a_get_its_query() -> None:
    reached, sent = await call(echo, "POST", b'{"a":"b"}')
    assert reached == [] and sent[0]["status"] == 200 and orjson.loads(sent[1]["body"]) == {"a": "b"}
    assert dict(sent[0]["headers"]) == {b"content-length": b"9", b"content-type": b"application/json"}
    reached, sent = await call(echo, "GET", query=b"after=3&limit=%35")
    assert reached == [] and orjson.loads(sent[1]["body"]) == {"after": "3", "limit": "5"}
    reached, sent = await call(echo, "GET")
    assert reached == [] and orjson.loads(sent[1]["body"]) == {}


@pytest.mark.parametrize(
    ("method", "body", "options"),
    [
        ("POST", b"", {}),
        ("POST", b'["a"]', {}),
        ("POST", b'"a"', {}),
        ("POST", b'{"a":"b"', {}),
        ("POST", b'{"a":"\\ud800"}', {}),  # a lone surrogate
        ("POST", b'{"a":"\xff"}', {}),  # invalid UTF-8
        ("POST", b'{"a":NaN}', {}),
        ("POST", b'{"a":"b"}', {"query": b"x=1"}),
        ("POST", b'{"a":"b"}', {"content_type": b"application/json; charset=utf-8"}),
        ("POST", b'{"a":"b"}', {"content_type": b"text/plain"}),
        ("POST", b'{"a":"b"}', {"limit": 5}),
        ("GET", b"", {"query": b"after=1&after=2"}),
        ("GET", b"", {"query": b"after=1&"}),
        ("GET", b"", {"query": b"after"}),
        ("GET", b"", {"query": b"\xff=1"}),
    ],
)
async def test_anything_less_plain_goes_to_the_route_with_its_body(method: str, body: bytes, options: dict) -> None:
    reached, sent = await call(echo, method, body, **options)
    assert reached == [body]
    assert sent[0]["status"] == 299


async def test_a_handler_that_declines_hands_the_request_on_with_its_body() -> None:
    async def declines(scope: Any, data: dict[str, Any]) -> None:
        return None

    reached, sent = await call(declines, "POST", b'{"a":"b"}')
    assert reached == [b'{"a":"b"}'] and sent[0]["status"] == 299


@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (errors.InvalidInput("bad"), 400, "bad"),
        (errors.NotFound("none"), 404, "none"),
        (errors.Busy("again"), 503, "again"),
        (ConnectionResetError(), 503, "the database is unavailable; nothing was recorded, retry"),
        (RuntimeError("a bug"), 500, "internal error"),
    ],
)
async def test_an_error_once_begun_is_answered_as_the_routes_answer_it_and_not_retried(
    raised: Exception, status: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails(scope: Any, data: dict[str, Any]) -> None:
        raise raised

    with caplog.at_level(logging.WARNING):
        reached, sent = await call(fails, "POST", b'{"a":"b"}')
    assert reached == []
    assert sent[0]["status"] == status
    assert orjson.loads(sent[1]["body"])["message"] == message
    if status == 500:
        assert any(record.exc_info and record.exc_info[1] is raised for record in caplog.records)


async def test_an_authentication_failure_carries_the_bearer_challenge() -> None:
    async def refuses(scope: Any, data: dict[str, Any]) -> None:
        raise errors.AuthenticationFailed("authentication failed")

    _, sent = await call(refuses, "GET")
    assert sent[0]["status"] == 401
    assert (b"www-authenticate", b"Bearer") in sent[0]["headers"]


async def test_a_client_that_leaves_before_its_body_gets_nothing() -> None:
    inner = Inner()
    scope = {"type": "http", "method": "POST", "path": "/r", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await FastPath(inner, 100, {("POST", "/r"): echo})(scope, receive, send)
    assert sent == [] and inner.bodies == []


async def call_path(path: str, method: str = "GET") -> tuple[list[bytes], list[dict], dict]:
    """A request for ``path`` to a fast path whose one route is templated."""
    inner = Inner()
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": []}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def segment(scope: Any, data: dict[str, Any]) -> tuple[int, bytes]:
        return 200, orjson.dumps(scope["path_params"])

    await FastPath(inner, 100, {("GET", "/r/{id}/p"): segment, ("GET", "/r"): echo})(scope, receive, send)
    return inner.bodies, sent, scope


async def test_a_templated_route_gets_its_segment_and_leaves_its_template_for_the_metrics() -> None:
    reached, sent, scope = await call_path("/r/a%20b/p")
    assert reached == [] and orjson.loads(sent[1]["body"]) == {"id": "a%20b"}
    assert scope["route"].path_format == "/r/{id}/p"
    # An exact route is found as before, and no template is looked for.
    reached, sent, scope = await call_path("/r")
    assert reached == [] and orjson.loads(sent[1]["body"]) == {} and "route" not in scope


@pytest.mark.parametrize(("path", "method"), [("/r//p", "GET"), ("/r/a/b/p", "GET"), ("/r/a/p/", "GET"), ("/r/a", "GET"), ("/r/a/p", "POST")])
async def test_a_path_not_of_the_template_goes_to_the_app(path: str, method: str) -> None:
    reached, sent, scope = await call_path(path, method)
    assert sent[0]["status"] == 299 and "route" not in scope


@pytest.mark.parametrize("path", ["/r/{a}/{b}", "/r/x{a}", "/r/{a}x"])
def test_a_fast_route_has_at_most_one_parameter_and_it_is_a_whole_segment(path: str) -> None:
    with pytest.raises(ValueError, match="one path parameter"):
        FastPath(Inner(), 100, {("GET", path): echo})


# --- each fast twin is declared on its route's router, and the gateway runs them all ----


def test_a_twin_takes_its_method_and_path_from_its_route() -> None:
    routes = router()

    @routes.get("/r/{id}")
    async def read(id: str) -> None: ...

    @routes.fast(read)
    async def fast_read(scope: Any, query: dict[str, str]) -> None: ...

    assert routes.fast_routes == {("GET", "/r/{id}"): fast_read}


def test_a_twin_of_anything_but_one_route_of_one_method_of_its_router_is_refused() -> None:
    routes, others = router(), router()

    @others.post("/r")
    async def elsewhere() -> None: ...

    @routes.api_route("/r", methods=["GET", "POST"])
    async def both() -> None: ...

    @routes.get("/once")
    async def once() -> None: ...

    async def undeclared() -> None: ...

    with pytest.raises(ValueError, match="not the endpoint of one route of this router"):
        routes.fast(elsewhere)
    with pytest.raises(ValueError, match="not the endpoint of one route of this router"):
        routes.fast(undeclared)
    with pytest.raises(ValueError, match="more than one method"):
        routes.fast(both)
    routes.fast(once)(echo)
    with pytest.raises(ValueError, match="already has a fast twin"):
        routes.fast(once)
    assert routes.fast_routes == {("GET", "/once"): echo}


def test_two_routers_of_one_server_cannot_both_have_a_twin_for_one_method_and_path() -> None:
    first, second = router(), router()
    for routes in (first, second):

        @routes.get("/r")
        async def read() -> None: ...

        routes.fast(read)(echo)
    with pytest.raises(ValueError, match="GET /r has a fast twin on two routers of one server"):
        fast_routes([first, second])


def declared_routers(server: str) -> list[Router]:
    """The ``agent`` or ``public`` router of every area's ``routes`` module."""
    found = []
    for area in pkgutil.iter_modules(agent_gateway.__path__):
        if not area.ispkg:
            continue
        try:
            module = importlib.import_module(f"agent_gateway.{area.name}.routes")
        except ModuleNotFoundError:
            continue
        declared = getattr(module, server, None)
        if isinstance(declared, Router):
            found.append(declared)
    return found


def run_by(fast: FastPath) -> dict[tuple[str, str], Any]:
    """What a fast path runs, its templated routes included, by method and path."""
    return {**fast.routes, **{(template.method, template.path_format): template.handler for template in fast.templates}}


@pytest.mark.parametrize("scheduler_agent_routes", [True, False])
def test_each_server_runs_every_fast_twin_its_routers_declare_each_once(
    settings: config.Settings, scheduler_agent_routes: bool
) -> None:
    gateway = Gateway(dataclasses.replace(settings, ops_listen=None, scheduler_agent_routes=scheduler_agent_routes))
    for server, asgi, app in (
        ("agent", gateway.agent_asgi, gateway.agent_app),
        ("public", gateway.public_asgi, gateway.public_app),
    ):
        assert isinstance(asgi, FastPath)
        declared = [router.fast_routes for router in declared_routers(server)]
        run = run_by(asgi)
        assert run == {route: handler for twins in declared for route, handler in twins.items()}
        # No method and path has two twins on one server: nothing was overwritten in the merge.
        assert len(run) == sum(len(twins) for twins in declared) > 0
        for (method, path), handler in run.items():
            scope = {"type": "http", "method": method, "path": path.replace("{seq}", "7"), "root_path": ""}
            # The twin is what the fast path runs for a request of its route ...
            found = asgi.routes.get((method, scope["path"])) or asgi._template(scope).handler  # type: ignore[union-attr]
            assert found is handler
            # ... which the server's app serves behind it.
            assert any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)


# --- each fast route answers as its FastAPI route -----------------------------------


@pytest.fixture
async def user_and_token(gateway: Gateway) -> tuple[str, dict[str, str]]:
    async with gateway.store.transaction() as conn:
        user = await users.admit(conn)
        issued = await auth.issue_token(conn, user.id, ttl_ms=60_000)
    return user.id, {"Authorization": f"Bearer {issued.token}"}


def assert_same_answer(fast: httpx.Response, routed: httpx.Response, *, same_body: bool = True) -> None:
    assert fast.status_code == routed.status_code
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert fast.headers.get("www-authenticate") == routed.headers.get("www-authenticate")
    if same_body:
        assert fast.content == routed.content
        assert fast.headers["content-length"] == routed.headers["content-length"]
    else:
        assert fast.json().keys() == routed.json().keys()


async def post_both(client: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    content = orjson.dumps(body)
    fast = await client.post(path, content=content, headers={"Content-Type": "application/json", **(headers or {})})
    routed = await client.post(path, content=content, headers={**ROUTED_JSON, **(headers or {})})
    return fast, routed


async def get_both(client: httpx.AsyncClient, path: str, query: str, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    fast = await client.get(f"{path}?{query}" if query else path, headers=headers)
    routed = await client.get(f"{path}?{query}&", headers=headers)
    return fast, routed


async def test_publishing_a_decision(agent: httpx.AsyncClient) -> None:
    fast, routed = await post_both(agent, "/decisions", {"statement": "s"})
    assert_same_answer(fast, routed, same_body=False)
    assert (fast.status_code, fast.json()["seq"], routed.json()["seq"]) == (201, 1, 2)
    fast, routed = await post_both(agent, "/decisions", {"statement": ""})
    assert_same_answer(fast, routed)
    assert fast.status_code == 400


@pytest.mark.parametrize("query", ["", "limit=1", "after=0", "before=2", "after=0&limit=200", "limit=0", "after=1&before=2", "x=1"])
@pytest.mark.parametrize("server", ["agent", "public"])
async def test_reading_decisions(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, user_and_token, server: str, query: str
) -> None:
    for index in range(3):
        await agent.post("/decisions", json={"statement": f"d{index}"})
    client, headers = (agent, None) if server == "agent" else (public, user_and_token[1])
    fast, routed = await get_both(client, "/decisions", query, headers)
    assert_same_answer(fast, routed)
    if server == "public":
        assert_same_answer(*await get_both(client, "/decisions", query, {"Authorization": "Bearer nobody"}))


async def test_sending_a_message(agent: httpx.AsyncClient, user_and_token) -> None:
    user_id, _ = user_and_token
    fast, routed = await post_both(agent, "/messages", {"userId": user_id, "text": "hi"})
    assert_same_answer(fast, routed, same_body=False)
    assert (fast.json()["seq"], routed.json()["seq"]) == (1, 2)
    nobody = "00000000-0000-4000-8000-000000000000"
    for body in ({"userId": nobody, "text": "hi"}, {"userId": user_id, "text": "a\x00b"}, {"userId": user_id.upper(), "text": "x"}):
        assert_same_answer(*await post_both(agent, "/messages", body), same_body=body["userId"] != user_id.upper())


async def test_receiving_a_message(public: httpx.AsyncClient, user_and_token) -> None:
    _, headers = user_and_token
    fast, routed = await post_both(public, "/messages", {"text": "hi"}, headers)
    assert_same_answer(fast, routed, same_body=False)
    assert (fast.status_code, fast.json()["seq"], routed.json()["seq"]) == (201, 1, 2)
    assert_same_answer(*await post_both(public, "/messages", {"text": "a\x00b"}, headers))
    for refused in ({}, {"Authorization": "Bearer nobody"}):
        assert_same_answer(*await post_both(public, "/messages", {"text": "hi"}, refused))


@pytest.mark.parametrize("query", ["", "after=1", "before=3&limit=1", "limit=201", "user=x"])
async def test_reading_ones_own_log(public: httpx.AsyncClient, user_and_token, query: str) -> None:
    _, headers = user_and_token
    for text in ("a", "b", "c"):
        await public.post("/messages", json={"text": text}, headers=headers)
    assert_same_answer(*await get_both(public, "/messages", query, headers))
    assert_same_answer(*await get_both(public, "/messages", query, {"Authorization": "Bearer nobody"}))


@pytest.mark.parametrize("query", ["user={user}", "user={user}&after=1", "user={USER}&limit=2", "", "user=x", "user={user}&before=-1"])
async def test_reading_a_users_log(agent: httpx.AsyncClient, user_and_token, query: str) -> None:
    user_id, _ = user_and_token
    for text in ("a", "b", "c"):
        await agent.post("/messages", json={"userId": user_id, "text": text})
    assert_same_answer(*await get_both(agent, "/messages", query.format(user=user_id, USER=user_id.upper())))


@pytest.mark.parametrize("query", ["", "x=1"])
async def test_reading_oneself(public: httpx.AsyncClient, user_and_token, query: str) -> None:
    _, headers = user_and_token
    fast, routed = await get_both(public, "/users/me", query, headers)
    assert_same_answer(fast, routed)
    assert fast.status_code == (200 if not query else 400)
    assert_same_answer(*await get_both(public, "/users/me", query, {"Authorization": "Bearer nobody"}))


async def asgi_get(app: Any, target: str, headers: dict[str, str] | None) -> dict:
    """The scope a GET of ``target`` leaves behind once ``app`` answered it."""
    path, _, query = target.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "headers": [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}  # fmt: skip

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200

    await app(scope, receive, send)
    return scope


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_proofs(
    gateway: Gateway, agent: httpx.AsyncClient, public: httpx.AsyncClient, user_and_token, server: str
) -> None:
    for index in range(5):
        await agent.post("/decisions", json={"statement": f"d{index}"})
    client, headers = (agent, None) if server == "agent" else (public, user_and_token[1])
    cases = {
        "/decisions/3/proof": ["", "size=3", "size=5", "size=2", "size=6", "size=0", "size=x", "size=03", "other=1"],
        "/decisions/9/proof": ["", "size=1"],
        "/decisions/0/proof": [""],
        "/decisions/03/proof": [""],
        "/decisions/2147483648/proof": [""],
        "/checkpoint/consistency": ["", "from=1", "from=2&to=4", "from=5&to=5", "to=3", "from=0", "from=4&to=3", "from=1&to=6", "from=-1", "to=x"],
    }
    answered = set()
    for path, queries in cases.items():
        for query in queries:
            fast, routed = await get_both(client, path, query, headers)
            assert_same_answer(fast, routed)
            answered.add(fast.status_code)
            if server == "public":
                assert_same_answer(*await get_both(client, path, query, {"Authorization": "Bearer nobody"}))
    assert answered == {200, 400, 404}
    # And those answers were the fast path's: it leaves its template behind.
    app = gateway.agent_asgi if server == "agent" else gateway.public_asgi
    assert (await asgi_get(app, "/decisions/3/proof", headers))["route"].path_format == "/decisions/{seq}/proof"
    assert "route" not in await asgi_get(app, "/checkpoint/consistency?from=2", headers)  # FastAPI's routing sets it


async def test_listing_signals_and_runs(gateway: Gateway, agent: httpx.AsyncClient) -> None:
    """The two lists agents poll: Signals (by kind) and Runs (by Signal)."""
    async with gateway.store.transaction() as conn:
        first = await signals.emit(conn, "fast.a", {"n": 1, "text": "é ✓ \u2028"})
        await signals.emit(conn, "fast.b", [1, None, {"z": 2.5}])
        await signals.emit(conn, "fast.a", "plain")
        await run_queries.record(
            conn, signal_id=first, prompts=[(str(uuid.uuid4()), f"s{n}", f"prompt {n}") for n in range(3)],
            first_started_at=clock.now_iso(),
        )

    async def settled() -> bool:  # the worker fails them (no Handler): compare what no longer changes
        return all(s["state"] == "failed" for s in (await agent.get("/signals")).json()["signals"])

    await until(settled)
    for query in ["", "limit=2", "kind=fast.a", "kind=fast.a&limit=1", "kind=", "kind=none", "kind=a%00b",
                  "limit=0", "limit=201", "limit=x", "limit=02", "x=1"]:  # fmt: skip
        assert_same_answer(*await get_both(agent, "/signals", query))
    for query in ["", "limit=2", "signalId={id}", "signalId={ID}&limit=1", "signalId=x", "signalId=",
                  "signalId=00000000-0000-4000-8000-000000000000", "limit=0", "x=1"]:  # fmt: skip
        assert_same_answer(*await get_both(agent, "/runs", query.format(id=first, ID=first.upper())))
    # Not started first, newest recorded first; then the started one.
    listed = (await agent.get("/runs", params={"signalId": first})).json()["runs"]
    assert [run["prompt"] for run in listed] == ["prompt 2", "prompt 1", "prompt 0"]
    assert [s["kind"] for s in (await agent.get("/signals", params={"kind": "fast.a"})).json()["signals"]] == ["fast.a"] * 2
    # Those answers were the fast path's (FastAPI's routing would have left the route in the scope).
    for target in ("/signals?kind=fast.a", "/runs?limit=3", f"/runs?signalId={first}"):
        assert "route" not in await asgi_get(gateway.agent_asgi, target, None)
