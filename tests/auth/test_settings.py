"""The auth settings are refused at start-up when invalid (spec: Authentication 7-8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.config import ScryptCost

from tests import served

pytestmark = pytest.mark.processes


def load(environ: dict[str, str]) -> config.Settings:
    return config.load(None, {"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "60000", **environ})


def test_defaults():
    settings = load({})
    assert settings.token_ttl_ms == 60000
    assert settings.scrypt == ScryptCost(15, 8, 1)


def test_the_token_lifetime_is_required():
    with pytest.raises(config.SettingsError, match="auth.token_ttl_ms"):
        config.load(None, {"AGENT_GATEWAY_DATABASE_URL": "sqlite:///gateway.db"})


def test_no_configuration_at_all_says_so():
    with pytest.raises(config.SettingsError, match="no configuration: pass --config or set AGENT_GATEWAY_CONFIG"):
        config.load(None, {})


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "abc", str(config.MAX_TOKEN_TTL_MS + 1)])
def test_an_invalid_token_lifetime_is_refused(value: str):
    with pytest.raises(config.SettingsError, match="auth.token_ttl_ms"):
        load({"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": value})


def test_the_longest_token_lifetime_is_accepted():
    assert load({"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": str(config.MAX_TOKEN_TTL_MS)}).token_ttl_ms == config.MAX_TOKEN_TTL_MS


@pytest.mark.parametrize(
    ("name", "value"),
    [("LOGN", "21"), ("LOGN", "0"), ("BLOCKSIZE", "0"), ("PARALLELISM", "-1"), ("LOGN", "x"), ("BLOCKSIZE", "1.5")],
)
def test_an_invalid_scrypt_parameter_is_refused(name: str, value: str):
    with pytest.raises(config.SettingsError, match="auth.scrypt"):
        load({f"AGENT_GATEWAY_AUTH_SCRYPT_{name}": value})


def test_a_scrypt_cost_too_large_to_derive_is_refused():
    with pytest.raises(config.SettingsError, match="auth.scrypt: .* MiB per derivation"):
        load({"AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "20", "AGENT_GATEWAY_AUTH_SCRYPT_BLOCKSIZE": "16"})


def test_scrypt_from_the_file(tmp_path: Path):
    path = tmp_path / "gateway.toml"
    path.write_text("[auth]\ntoken_ttl_ms = 5\nscrypt = { logN = 20, blockSize = 2, parallelism = 3 }\n")
    assert config.load(path, {}).scrypt == ScryptCost(20, 2, 3)
    path.write_text("[auth]\ntoken_ttl_ms = 5\nscrypt = { logN = 21 }\n")
    with pytest.raises(config.SettingsError, match="logN"):
        config.load(path, {})


def test_serve_refuses_to_start_with_an_invalid_cost(tmp_path: Path):
    directory = tmp_path / "deployment"
    assert served.run_cli("init", str(directory), config=directory / "gateway.toml").returncode == 0
    result = served.run_cli(
        "serve", config=directory / "gateway.toml", env={"AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "21"}
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "agent-gateway: error: auth.scrypt.logN (AGENT_GATEWAY_AUTH_SCRYPT_LOGN): must be at most 20"
    ]
