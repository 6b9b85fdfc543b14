"""The ops listener, like the Agent server, answers only requests addressed to its own names, on a
real ``serve`` on both backends: a web page in a browser on the gateway's host can read its
metrics neither by DNS rebinding (its own name in ``Host``) nor from its own origin (``Origin``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent_gateway import config
from tests import served
from tests.mcp.test_endpoint import assert_error_body

pytestmark = pytest.mark.e2e

REBOUND = "rebind.attacker.example"
ALLOWED = "metrics.internal"
TIMEOUT_S = 120  # a ceiling for a broken build
ROUTES = ["/metrics", "/healthz", "/readyz"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    env = {"AGENT_GATEWAY_OPS_ALLOWED_HOSTS": f'["{ALLOWED}"]'}
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url, env=env) as gateway:
        yield gateway


def ops_url(gateway: served.ServedGateway) -> str:
    assert gateway.ops_url is not None
    return gateway.ops_url


def port(gateway: served.ServedGateway) -> int:
    return int(ops_url(gateway).rsplit(":", 1)[1])


def get(gateway: served.ServedGateway, path: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(ops_url(gateway) + path, headers=headers, timeout=TIMEOUT_S)


@pytest.mark.parametrize("path", ROUTES)
def test_a_rebound_name_is_refused(gateway: served.ServedGateway, path: str) -> None:
    rebound = f"{REBOUND}:{port(gateway)}"
    for headers in ({"Host": rebound, "Origin": f"http://{rebound}"}, {"Host": rebound}):
        response = get(gateway, path, headers)
        assert "ops.allowed_hosts (Host)" in assert_error_body(response, 421)
        assert "agent_gateway_" not in response.text


@pytest.mark.parametrize("origin", [f"http://{REBOUND}", "null", "http://127.0.0.1.rebind.example"])
def test_an_origin_of_another_host_is_refused(gateway: served.ServedGateway, origin: str) -> None:
    for path in ROUTES:
        assert "Origin" in assert_error_body(get(gateway, path, {"Origin": origin}), 403)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost", "[::1]:{port}", f"{ALLOWED}:{{port}}", ALLOWED.upper()])
def test_the_listener_s_own_names_are_served(gateway: served.ServedGateway, host: str) -> None:
    host = host.format(port=port(gateway))
    for origin in (None, f"http://{host}"):
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        metrics = get(gateway, "/metrics", headers)
        assert metrics.status_code == 200 and "agent_gateway_" in metrics.text
        assert get(gateway, "/healthz", headers).json() == {"status": "ok"}


@pytest.mark.parametrize("host", ["10.0.0.5:{port}", "[fd00::5]:{port}"])
def test_a_probe_or_a_scrape_by_the_pod_s_address_is_served(gateway: served.ServedGateway, host: str) -> None:
    """Kubernetes sends the pod's address in ``Host`` (and Prometheus its target's): no rebinding
    page can, so any address is served; a page's ``Origin`` is not."""
    headers = {"Host": host.format(port=port(gateway))}
    assert get(gateway, "/healthz", headers).json() == {"status": "ok"}
    assert "agent_gateway_" in get(gateway, "/metrics", headers).text
    assert "Origin" in assert_error_body(get(gateway, "/metrics", {**headers, "Origin": "http://10.0.0.5"}), 403)


def test_the_agent_server_s_names_are_not_the_listener_s(tmp_path: Path) -> None:
    """Each listener has its own list: a name allowed for the Agent server is refused here."""
    env = {"AGENT_GATEWAY_AGENT_ALLOWED_HOSTS": f'["{ALLOWED}"]'}
    with served.ServedGateway.start(tmp_path / "deployment", f"sqlite:///{tmp_path / 'gateway.db'}", env) as gateway:
        assert httpx.get(f"{gateway.agent_url}/users", headers={"Host": ALLOWED}, timeout=TIMEOUT_S).status_code == 200
        assert get(gateway, "/metrics", {"Host": ALLOWED}).status_code == 421


@pytest.mark.parametrize("value", ['["metrics.internal:8702"]', '["http://metrics.internal"]', '["a b"]', "x"])
def test_allowed_hosts_are_names_or_addresses_without_a_port(tmp_path: Path, value: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[auth]\ntoken_ttl_ms = 1000\n", encoding="utf-8")
    with pytest.raises(config.SettingsError, match="ops.allowed_hosts"):
        config.load(path, environ={"AGENT_GATEWAY_OPS_ALLOWED_HOSTS": value})
