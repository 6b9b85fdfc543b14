"""The spec's cross-cutting HTTP rules on EVERY route of both servers (http/routing.py, app.py, errors.py).

Routes are found by walking ``Gateway.agent_app.routes`` and
``Gateway.public_app.routes`` at collection time, so routes added later are
covered without touching this file. A small probe app built with the same
``create_app`` adds what no foundation route has yet (a JSON body, a cursor
window, each domain error), so no rule here goes untested for want of a route.

These requests are all refused before any handler runs, so they never touch
storage: they run on SQLite only (a PostgreSQL database per case would cost a
second each for nothing).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any

import httpx
import orjson
import pytest
from fastapi import Depends, FastAPI
from fastapi.dependencies.utils import get_flat_params
from fastapi.params import Query
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import config, deployment, errors
from agent_gateway.gateway import Gateway
from agent_gateway.http import params
from agent_gateway.http.app import create_app, router
from agent_gateway.http.routing import StrictRoute, json_response
from agent_gateway.mcp import endpoint as mcp_endpoint
from agent_gateway.store.window import Window

BODY_LIMIT = 512
SAMPLE_UUID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
PATH_SAMPLES = {"id": SAMPLE_UUID, "seq": "1", "name": "x"}
QUERY_SAMPLES = {"limit": "1", "after": "0", "before": "1", "user": SAMPLE_UUID, "signalId": SAMPLE_UUID, "kind": "x"}
METHODS = ("PATCH", "DELETE", "PUT", "POST", "GET")


# --- the probe app ----------------------------------------------------------


class Item(BaseModel):
    model_config = ConfigDict(strict=True)
    text: str = Field(min_length=1)


probe_router = router()


@probe_router.post("/items", status_code=201)
async def create_item(item: Item) -> Any:
    return json_response(item.model_dump(), 201)


class Echo(BaseModel):
    value: Any = None


@probe_router.post("/echo")
async def echo(body: Echo) -> Any:
    return json_response({"value": body.value})


@probe_router.get("/log")
async def read_log(window: Annotated[Window, Depends(params.cursor_window)]) -> Any:
    return json_response(dataclasses.asdict(window))


@probe_router.get("/list")
async def read_list(limit: Annotated[int, Depends(params.list_limit)]) -> Any:
    return json_response({"limit": limit})


@probe_router.get("/items/{seq}")
async def read_item(seq: str) -> Any:
    return json_response({"seq": params.seq_path(seq)})


RAISED = {
    "invalid": errors.InvalidInput,
    "authentication": errors.AuthenticationFailed,
    "not-found": errors.NotFound,
    "too-large": errors.PayloadTooLarge,
    "media-type": errors.UnsupportedMediaType,
    "busy": errors.Busy,
}


@probe_router.get("/raise/{name}")
async def raise_error(name: str) -> Any:
    if name in RAISED:
        raise RAISED[name]()
    raise RuntimeError("a bug with a secret in its message: hunter2")


def probe_app() -> FastAPI:
    return create_app("probe", "a probe of the shared HTTP conventions", [probe_router], BODY_LIMIT)


# --- walking the routes ------------------------------------------------------


def _walked_apps() -> dict[str, FastAPI]:
    """The two servers' apps as ``agent-gateway init`` configures them (every route switched on)."""
    with tempfile.TemporaryDirectory() as folder:
        deployment.write(Path(folder))
        gateway = Gateway(config.load(Path(folder) / deployment.CONFIG_NAME, environ={}))
        return {"agent": gateway.agent_app, "public": gateway.public_app, "probe": probe_app()}


APPS = _walked_apps()


@dataclasses.dataclass(frozen=True)
class Endpoint:
    server: str
    method: str
    path: str
    route: APIRoute  # the route as declared (an included router's routes keep their class)
    documented: bool

    def __str__(self) -> str:
        return f"{self.server} {self.method} {self.path}"

    @property
    def url(self) -> str:
        return re.sub(r"\{(\w+)(:\w+)?\}", lambda match: PATH_SAMPLES.get(match.group(1), "x"), self.path)

    @property
    def has_body(self) -> bool:
        return self.route.body_field is not None

    @property
    def query_names(self) -> list[str]:
        flat = get_flat_params(self.route.dependant)
        return sorted(field.alias for field in flat if isinstance(field.field_info, Query))


def _endpoints() -> list[Endpoint]:
    found = []
    for server, app in APPS.items():
        for context in iter_route_contexts(app.routes):
            route = context.original_route
            if server == "agent" and context.path == mcp_endpoint.PATH:
                continue  # the MCP transport, not an API route: tests/mcp checks these rules there
            assert isinstance(route, APIRoute), f"{server}: {route!r} is not an API route"
            for method in sorted(context.methods or ()):
                found.append(Endpoint(server, method, context.path, route, context.include_in_schema))
    return found


ENDPOINTS = _endpoints()
BODY_ENDPOINTS = [endpoint for endpoint in ENDPOINTS if endpoint.has_body]
QUERY_CASES = [(endpoint, name) for endpoint in ENDPOINTS for name in endpoint.query_names]
PATHS = sorted({(endpoint.server, endpoint.path): endpoint for endpoint in ENDPOINTS}.values(), key=str)


def endpoints(cases: list[Any]) -> Any:
    return pytest.mark.parametrize("endpoint", cases, ids=str)


# --- fixtures and checks ----------------------------------------------------


@pytest.fixture
def database_url(sqlite_template: Path, tmp_path: Path) -> str:
    """SQLite only (see the module docstring)."""
    path = tmp_path / "gateway.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def settings(settings: config.Settings) -> config.Settings:
    return dataclasses.replace(settings, max_body_bytes=BODY_LIMIT)


@pytest.fixture
async def probe() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=probe_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        yield client


@pytest.fixture
def client(request: pytest.FixtureRequest) -> httpx.AsyncClient:
    """The in-process client of the server the parametrized ``endpoint`` or ``server`` names."""
    server = request.node.callspec.params.get("server") or request.node.callspec.params["endpoint"].server
    return request.getfixturevalue(server)


def assert_error(response: httpx.Response, status: int) -> str:
    """The one error shape: exactly ``{statusCode, error, message}``, JSON; returns the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"statusCode", "error", "message"}, body
    assert body["statusCode"] == status
    assert body["error"] == HTTPStatus(status).phrase
    assert isinstance(body["message"], str) and body["message"]
    return body["message"]


# --- the rules, route by route ------------------------------------------------


def test_every_server_has_routes() -> None:
    assert {endpoint.server for endpoint in ENDPOINTS} == {"agent", "public", "probe"}
    assert BODY_ENDPOINTS and QUERY_CASES


@endpoints(ENDPOINTS)
def test_every_route_is_strict(endpoint: Endpoint) -> None:
    assert isinstance(endpoint.route, StrictRoute)


@endpoints(ENDPOINTS)
async def test_unknown_query_parameter(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    response = await client.request(endpoint.method, endpoint.url, params={"unknown_parameter": "1"})
    assert "unknown_parameter" in assert_error(response, 400)


@endpoints([endpoint for endpoint in ENDPOINTS if "user" not in endpoint.query_names])
async def test_user_is_never_a_silent_query_parameter(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    # Spec, Authentication 3: `user` written where it is not defined is refused.
    response = await client.request(endpoint.method, endpoint.url, params={"user": SAMPLE_UUID})
    assert_error(response, 400)


@pytest.mark.parametrize(("endpoint", "name"), QUERY_CASES, ids=lambda value: str(value))
async def test_a_parameter_given_twice(endpoint: Endpoint, name: str, client: httpx.AsyncClient) -> None:
    value = QUERY_SAMPLES.get(name, "x")
    response = await client.request(endpoint.method, endpoint.url, params=[(name, value), (name, value)])
    assert "more than once" in assert_error(response, 400)


@endpoints(PATHS)
async def test_wrong_method(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    served = {e.method for e in ENDPOINTS if (e.server, e.path) == (endpoint.server, endpoint.path)}
    unused = [method for method in METHODS if method not in served]
    response = await client.request(unused[0], endpoint.url)
    assert_error(response, 405)
    assert set(response.headers["allow"].split(", ")) == served


# The Public server's / is the chat page (web/; tests/web covers it switched off).
UNKNOWN_PATHS = [
    (server, path)
    for server in ("agent", "public", "probe")
    for path in ("/", "/no-such-route", "/users/x/y/z", "/openapi.json/x", "/docs", "/redoc")
    if (server, path) not in {(endpoint.server, endpoint.path) for endpoint in ENDPOINTS}
]


@pytest.mark.parametrize(("server", "path"), UNKNOWN_PATHS)
async def test_unknown_path(server: str, path: str, client: httpx.AsyncClient) -> None:
    for method in ("GET", "POST", "DELETE"):
        assert_error(await client.request(method, path), 404)


@endpoints(BODY_ENDPOINTS)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
async def test_a_body_that_is_not_json(endpoint: Endpoint, content_type: str | None, client: httpx.AsyncClient) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = await client.request(endpoint.method, endpoint.url, content=b'{"text": "x"}', headers=headers)
    assert_error(response, 415)


@endpoints(BODY_ENDPOINTS)
@pytest.mark.parametrize(
    "body",
    [
        b'{"text": ',
        b"{'text': 'x'}",
        b'{"text": "x"} trailing',
        b'{"text": "\xff"}',  # invalid UTF-8
        b'{"text": "\xed\xa0\x80"}',  # an encoded surrogate is not UTF-8
        b'{"text": "\\ud800"}',  # a lone surrogate escape
        b'{"text": NaN}',
        b'{"text": Infinity}',
        b'{"text": -Infinity}',
        b'{"text": 1e400}',
        b"\xef\xbb\xbf{}",  # a byte order mark
    ],
    ids=repr,
)
async def test_a_body_that_is_not_strict_json(endpoint: Endpoint, body: bytes, client: httpx.AsyncClient) -> None:
    response = await client.request(
        endpoint.method, endpoint.url, content=body, headers={"content-type": "application/json"}
    )
    assert "JSON" in assert_error(response, 400)


@endpoints(BODY_ENDPOINTS)
async def test_a_body_over_the_limit_with_content_length(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    body = b'{"text": "' + b"x" * BODY_LIMIT + b'"}'
    response = await client.request(
        endpoint.method, endpoint.url, content=body, headers={"content-type": "application/json"}
    )
    assert str(BODY_LIMIT) in assert_error(response, 413)


@endpoints(BODY_ENDPOINTS)
async def test_a_chunked_body_over_the_limit(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"text": "'
        for _ in range(BODY_LIMIT // 64 + 1):
            yield b"x" * 64
        yield b'"}'

    request = client.build_request(
        endpoint.method, endpoint.url, content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in request.headers and request.headers["transfer-encoding"] == "chunked"
    assert str(BODY_LIMIT) in assert_error(await client.send(request), 413)


# --- /openapi.json ------------------------------------------------------------


def documented(server: str) -> set[str]:
    return {endpoint.path for endpoint in ENDPOINTS if endpoint.server == server and endpoint.documented}


@pytest.mark.parametrize("server", ["agent", "public", "probe"])
async def test_openapi_describes_its_own_server(server: str, client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == documented(server)
    assert schema["info"]["title"] == APPS[server].title
    assert "/openapi.json" not in schema["paths"]


@pytest.mark.parametrize("server", ["agent", "public", "probe"])
async def test_openapi_declares_error_responses_and_never_422(server: str, client: httpx.AsyncClient) -> None:
    text = (await client.get("/openapi.json")).text
    assert "422" not in text
    assert "HTTPValidationError" not in text and '"detail"' not in text
    schema = orjson.loads(text)
    error_body = schema.get("components", {}).get("schemas", {}).get("ErrorBody")
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            route = next(
                e.route for e in ENDPOINTS if e.server == server and e.path == path and e.method == method.upper()
            )
            expected = {"400"} | ({"413", "415"} if route.body_field is not None else set())
            assert expected <= set(operation["responses"]), (path, method)
            for status in expected:
                ref = operation["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody")
    if schema["paths"]:
        assert error_body is not None
        assert set(error_body["required"]) == {"statusCode", "error", "message"}
        assert set(error_body["properties"]) == {"statusCode", "error", "message"}


@pytest.mark.parametrize("server", ["agent", "public"])
async def test_openapi_refuses_query_parameters(server: str, client: httpx.AsyncClient) -> None:
    for query in ({"format": "json"}, {"limit": "1"}):
        assert "no query parameters" in assert_error(await client.get("/openapi.json", params=query), 400)


# --- the mechanisms, through the probe ------------------------------------------


async def test_a_json_body_at_the_limit_is_accepted(probe: httpx.AsyncClient) -> None:
    filler = BODY_LIMIT - len(b'{"text": ""}')
    body = b'{"text": "' + b"x" * filler + b'"}'
    assert len(body) == BODY_LIMIT
    response = await probe.post("/items", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 201
    assert response.json() == {"text": "x" * filler}


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=UTF-8",
        "application/json;charset=\"utf-8\"",
        "Application/JSON",
        "application/merge-patch+json",
    ],
)
async def test_json_content_types(probe: httpx.AsyncClient, content_type: str) -> None:
    response = await probe.post("/items", content=b'{"text": "\\u00e9 ok"}', headers={"content-type": content_type})
    assert response.status_code == 201
    assert response.json() == {"text": "é ok"}


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=klingon", "application/json; charset=latin-1", "application/json; charset=utf-16"],
)
async def test_a_json_body_in_another_charset_is_415(probe: httpx.AsyncClient, content_type: str) -> None:
    response = await probe.post("/items", content=b'{"text": "x"}', headers={"content-type": content_type})
    assert_error(response, 415)


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b'{"text": ""}', b'{"text": 1}', b'{"text": ["x"]}', b'{"text": null}', b"[]", b'"text"', b"null"],
    ids=repr,
)
async def test_body_validation_is_400_never_422(probe: httpx.AsyncClient, body: bytes) -> None:
    response = await probe.post("/items", content=body, headers={"content-type": "application/json"})
    assert_error(response, 400)


async def test_a_body_keeps_every_json_value_exactly(probe: httpx.AsyncClient) -> None:
    text = '{"value": {"z": [100000000000000000000000000001, -0.0, 1.5e300], "a": "\\u0000 é"}}'
    response = await probe.post("/echo", content=text.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.content == b'{"value":{"z":[100000000000000000000000000001,-0.0,1.5e+300],"a":"\\u0000 \xc3\xa9"}}'


async def test_dependency_query_parameters_are_declared(probe: httpx.AsyncClient) -> None:
    assert (await probe.get("/log")).json() == {"after": None, "before": None, "limit": 50}
    assert (await probe.get("/log", params={"after": "0", "limit": "200"})).json() == {
        "after": 0,
        "before": None,
        "limit": 200,
    }
    assert (await probe.get("/log", params={"before": "2147483647", "limit": "1"})).json() == {
        "after": None,
        "before": 2147483647,
        "limit": 1,
    }
    assert "combined" in assert_error(await probe.get("/log", params={"after": "1", "before": "2"}), 400)
    assert "unknown" in assert_error(await probe.get("/log", params={"cursor": "1"}), 400)


@pytest.mark.parametrize("name", ["after", "before"])
@pytest.mark.parametrize("value", ["-1", "2147483648", "1.0", "+1", "01", "", "x", " 1"])
async def test_bad_cursor_values(probe: httpx.AsyncClient, name: str, value: str) -> None:
    assert name in assert_error(await probe.get("/log", params={name: value}), 400)


@pytest.mark.parametrize(
    ("value", "status"),
    [
        ("1", 200),
        ("2147483647", 200),
        ("0", 400),
        ("2147483648", 400),
        ("-1", 400),
        ("01", 400),
        ("1.0", 400),
        ("%2B1", 400),
        ("x", 400),
    ],
)
async def test_seq_path(probe: httpx.AsyncClient, value: str, status: int) -> None:
    response = await probe.get(f"/items/{value}")
    if status == 200:
        assert response.json() == {"seq": int(value)}
    else:
        assert "seq" in assert_error(response, 400)


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("invalid", 400),
        ("authentication", 401),
        ("not-found", 404),
        ("too-large", 413),
        ("media-type", 415),
        ("busy", 503),
    ],
)
async def test_each_domain_error_has_its_status(probe: httpx.AsyncClient, name: str, status: int) -> None:
    response = await probe.get(f"/raise/{name}")
    assert assert_error(response, status) == RAISED[name].__doc__
    assert (response.headers.get("www-authenticate") == "Bearer") is (status == 401)


async def test_an_unexpected_error_is_a_bare_500(probe: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    response = await probe.get("/raise/bug")
    assert assert_error(response, 500) == "internal error"
    assert "hunter2" not in response.text
