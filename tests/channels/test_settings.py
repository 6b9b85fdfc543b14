"""``[channels.matrix]``: its keys, their environment overrides and their refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.channels import matrix

TABLE = """
[auth]
token_ttl_ms = 1000
[channels.matrix]
homeserver = "https://matrix.example.org/"
user_id = "@agent:example.org"
access_token_file = "matrix-token"
"""


def test_the_table_serves_matrix(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(TABLE)
    settings = config.load(path, environ={})
    assert settings.channels == frozenset({"matrix"})
    assert settings.matrix_homeserver == "https://matrix.example.org"
    assert settings.matrix_access_token_file == tmp_path / "matrix-token"
    assert settings.matrix_policy == "pairing"
    overridden = config.load(path, environ={"AGENT_GATEWAY_CHANNELS_MATRIX_POLICY": "open"})
    assert overridden.matrix_policy == "open"


def test_no_table_no_channel(tmp_path: Path) -> None:
    assert config.load(environ={"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1000"}).channels == frozenset()


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (('user_id = "@agent:example.org"\n', ""),
         "channels.matrix.user_id: required to serve the Matrix channel (with homeserver, user_id and access_token_file)"),
        (('user_id = "@agent:example.org"', 'user_id = "agent"'),
         'channels.matrix.user_id: must be a Matrix user ID, such as "@agent:example.org"'),
        (('homeserver = "https://matrix.example.org/"', 'homeserver = "matrix.example.org"'),
         "channels.matrix.homeserver: must be the http:// or https:// base URL of the homeserver's client-server API, "
         "without credentials"),
        (('access_token_file = "matrix-token"', 'access_token_file = "matrix-token"\npolicy = "everyone"'),
         'channels.matrix.policy: must be "pairing", "allowlist" or "open"'),
        (('access_token_file = "matrix-token"', 'access_token_file = "matrix-token"\naccess_token = "x"'),
         "channels.matrix.access_token: unknown setting"),
    ],
)
def test_refusals(tmp_path: Path, change: tuple[str, str], line: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(TABLE.replace(*change))
    with pytest.raises(config.SettingsError) as raised:
        config.load(path, environ={})
    assert str(raised.value) == line


def test_the_token_file_is_read_stripped_and_never_shown(tmp_path: Path) -> None:
    token_file = tmp_path / "matrix-token"
    token_file.write_text("  syt_abc \n")
    assert matrix.read_token(token_file) == "syt_abc"
    token_file.write_text("syt_abc syt_def")
    with pytest.raises(config.SettingsError) as raised:
        matrix.read_token(token_file)
    assert "syt_" not in str(raised.value)
    with pytest.raises(config.SettingsError, match="no such file"):
        matrix.read_token(tmp_path / "absent")
