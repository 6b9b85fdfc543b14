"""Two gateways on one host: a listener that cannot bind names its setting; ``init`` keeps the three ports together."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import served

pytestmark = pytest.mark.e2e

# docs/operate/control.md: how a second deployment on the host moves its three ports.
DOCUMENTED_EDIT = "sed -i -e 's/127.0.0.1:8700/127.0.0.1:8710/' -e 's/127.0.0.1:8701/127.0.0.1:8711/' -e 's/127.0.0.1:8702/127.0.0.1:8712/' gateway.toml"
LISTEN_LINE = re.compile(r'^listen = "127\.0\.0\.1:(\d+)"$', re.MULTILINE)


def init(directory: Path) -> Path:
    result = served.run_cli("init", str(directory), config=directory / "gateway.toml")
    assert result.returncode == 0, result.stderr
    return directory / "gateway.toml"


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[served.ServedGateway]:
    """The gateway already on the host, the same for each clash: none changes it."""
    directory = tmp_path_factory.mktemp("first")
    with served.ServedGateway.start(directory / "deployment", f"sqlite:///{directory / 'first.db'}") as gateway:
        yield gateway


@pytest.mark.parametrize(
    ("clash", "setting"),
    [
        ("OPS", "ops.listen (or AGENT_GATEWAY_OPS_LISTEN)"),
        ("PUBLIC", "public.listen (or AGENT_GATEWAY_PUBLIC_LISTEN)"),
        ("AGENT", "agent.listen (or AGENT_GATEWAY_AGENT_LISTEN)"),
    ],
)
def test_a_second_gateway_on_a_taken_port_is_told_which_setting_to_change(
    first: served.ServedGateway, tmp_path: Path, clash: str, setting: str
) -> None:
    # Its own deployment and ports, but for one listener: the first one's address
    # (with both on init's defaults, the ops listener is the one a newcomer forgets).
    config = init(tmp_path / "second")
    ports = {
        f"AGENT_GATEWAY_{name}_LISTEN": f"127.0.0.1:{served.free_port()}" for name in ("PUBLIC", "AGENT", "OPS")
    }
    taken = first.env[f"AGENT_GATEWAY_{clash}_LISTEN"]
    ports[f"AGENT_GATEWAY_{clash}_LISTEN"] = taken
    second = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "serve"],
        env=served.cli_env(config, ports),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"agent-gateway: error: cannot listen on {taken}: Address already in use; set {setting} to a free address"
    ]
    # The first one is untouched.
    assert httpx.get(f"{first.ops_url}/healthz", timeout=120).status_code == 200


def test_init_writes_the_three_ports_together_and_the_documented_edit_moves_them(tmp_path: Path) -> None:
    config = init(tmp_path / "second")
    text = config.read_text()
    # One place to edit: the three listen lines follow one another, public, agent, ops.
    assert LISTEN_LINE.findall(text) == ["8700", "8701", "8702"]
    first, last = (match.start() for match in list(LISTEN_LINE.finditer(text))[::2])
    assert text[first:last].count("\n[") == 2  # [agent] and [ops] between, nothing else
    subprocess.run(DOCUMENTED_EDIT, shell=True, cwd=config.parent, check=True)
    edited = config.read_text()
    assert LISTEN_LINE.findall(edited) == ["8710", "8711", "8712"]
    assert LISTEN_LINE.sub("", edited) == LISTEN_LINE.sub("", text)


def test_an_inited_config_with_its_three_ports_moved_serves_beside_another(tmp_path: Path) -> None:
    with served.ServedGateway.start(tmp_path / "first", f"sqlite:///{tmp_path / 'first.db'}") as first:
        config = init(tmp_path / "second")
        # The documented edit, to ports free on this busy machine rather than 8710-8712.
        moved = {name: served.free_port() for name in ("PUBLIC", "AGENT", "OPS")}
        text = config.read_text()
        for default, name in zip(("8700", "8701", "8702"), moved, strict=True):
            text = text.replace(f':{default}"', f':{moved[name]}"')
        config.write_text(text)
        env = served.cli_env(config)
        del env["AGENT_GATEWAY_OPS_LISTEN"]  # the file alone decides, as for a newcomer
        log = config.parent / "serve.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "agent_gateway", "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        addresses = {f"AGENT_GATEWAY_{name}_LISTEN": f"127.0.0.1:{port}" for name, port in moved.items()}
        second = served.ServedGateway(config.parent, process, addresses, log)
        try:
            second.wait_ready()
            for gateway in (first, second):
                assert httpx.get(f"{gateway.ops_url}/healthz", timeout=120).status_code == 200
                assert httpx.get(f"{gateway.public_url}/openapi.json", timeout=120).status_code == 200
        finally:
            assert second.stop() == 0
        assert "Traceback" not in second.output()
