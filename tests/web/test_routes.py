"""The chat page's routes on the Public server (web/routes.py): files, headers, the query rule, the setting."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from http import HTTPStatus

import httpx
import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.web import routes

SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def assert_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["statusCode"] == status
    assert response.json()["error"] == HTTPStatus(status).phrase


def assert_protected(response: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value
    policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no other origin
    assert policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"


def linked(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', page)


async def test_the_page_is_served_at_the_root_with_strict_headers(public: httpx.AsyncClient) -> None:
    response = await public.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert_protected(response)
    page = response.text
    assert '<meta name="viewport"' in page  # readable on a phone
    assert "<style" not in page and " style=" not in page and "<script>" not in page  # nothing inline
    assert linked(page) and all(url.startswith(routes.ASSET_PREFIX) for url in linked(page))


async def test_every_asset_the_page_names_is_served_from_the_package(public: httpx.AsyncClient) -> None:
    types = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
    for url in linked((await public.get("/")).text):
        response = await public.get(url)
        assert response.status_code == 200, url
        assert response.headers["content-type"] == types[url[url.rindex(".") :]]
        assert_protected(response)
        # Nothing is fetched from another origin: no absolute URL in any asset.
        assert not re.search(rb"https?://", response.content.replace(b"http://www.w3.org/2000/svg", b"")), url


@pytest.mark.parametrize("path", ["/web/nothing.js", "/web/index.html", "/web/..%2Fweb%2Froutes.py", "/web/", "/web"])
async def test_a_file_the_page_does_not_ship_is_404(public: httpx.AsyncClient, path: str) -> None:
    assert_error(await public.get(path), 404)


@pytest.mark.parametrize("path", ["/", "/web/chat.js"])
@pytest.mark.parametrize("query", ["token=x", "v=1", "user=3f2504e0-4f89-41d3-9a0c-0305e82c3301"])
async def test_any_query_parameter_is_400(public: httpx.AsyncClient, path: str, query: str) -> None:
    assert_error(await public.get(f"{path}?{query}"), 400)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_other_methods_are_405(public: httpx.AsyncClient, method: str) -> None:
    response = await public.request(method, "/")
    assert_error(response, 405)
    assert response.headers["allow"] == "GET"


async def test_the_agent_server_has_no_page(agent: httpx.AsyncClient) -> None:
    assert_error(await agent.get("/"), 404)
    assert_error(await agent.get("/web/chat.js"), 404)


@pytest.fixture
async def public_without_page(settings: config.Settings) -> AsyncIterator[httpx.AsyncClient]:
    gateway = Gateway(dataclasses.replace(settings, public_chat_page=False))
    await gateway.start()
    try:
        transport = httpx.ASGITransport(app=gateway.public_asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
            yield client
    finally:
        await gateway.stop()


async def test_switched_off_the_page_is_the_specs_404(public_without_page: httpx.AsyncClient) -> None:
    for path in ("/", "/web/chat.js", "/web/chat.css", "/web/icon.svg"):
        assert_error(await public_without_page.get(path), 404)
    # The API is unchanged.
    assert (await public_without_page.get("/jwks.json")).status_code == 200


def test_the_setting_reads_from_the_file_and_the_environment(tmp_path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[auth]\ntoken_ttl_ms = 1000\n", encoding="utf-8")
    assert config.load(path, environ={}).public_chat_page is True
    path.write_text("[auth]\ntoken_ttl_ms = 1000\n[public]\nchat_page = false\n", encoding="utf-8")
    assert config.load(path, environ={}).public_chat_page is False
    assert config.load(path, environ={"AGENT_GATEWAY_PUBLIC_CHAT_PAGE": "true"}).public_chat_page is True
    path.write_text('[auth]\ntoken_ttl_ms = 1000\n[public]\nchat_page = "maybe"\n', encoding="utf-8")
    with pytest.raises(config.SettingsError, match=r"^public\.chat_page: must be true or false$"):
        config.load(path, environ={})
