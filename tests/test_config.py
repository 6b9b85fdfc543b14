"""Settings: defaults, TOML values, environment overrides, relative paths, refusals (config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.config import Address, ScryptCost, SettingsError

REQUIRED = "[auth]\ntoken_ttl_ms = 1000\n"


def write(tmp_path: Path, text: str, name: str = "gateway.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str = REQUIRED, environ: dict[str, str] | None = None) -> config.Settings:
    return config.load(write(tmp_path, text), environ=environ or {})


def test_defaults(tmp_path: Path) -> None:
    settings = load(tmp_path)
    assert settings.token_ttl_ms == 1000
    assert settings.database_url == f"sqlite:///{tmp_path.resolve()}/gateway.db"
    assert settings.public_listen == Address("127.0.0.1", 8700)
    assert settings.agent_listen == Address("127.0.0.1", 8701)
    assert settings.scrypt == ScryptCost(log_n=15, block_size=8, parallelism=1)
    assert settings.scheduler_max_sleep_ms == 60_000
    assert settings.scheduler_agent_routes is True
    assert settings.max_body_bytes == 1024 * 1024
    assert settings.http_workers == 1
    assert settings.signing_key_file is None
    assert settings.signing_algorithm is None
    assert settings.runtime_command is None
    assert settings.runtime_mode == "per-run"
    assert settings.handlers == {}
    assert settings.log_level == "INFO"


ALL_KEYS = """\
[database]
url = "postgresql://someone@db.example:5432/gw"
[public]
listen = "0.0.0.0:9000"
[agent]
listen = "[::1]:9001"
[signing]
key_file = "/keys/k.pem"
algorithm = "RS256"
[auth]
token_ttl_ms = 5000
scrypt = { logN = 12, blockSize = 4, parallelism = 2 }
[scheduler]
max_sleep_ms = 1234
agent_routes = false
[http]
max_body_bytes = 4096
workers = 3
[runtime]
command = ["python", "-m", "agent"]
workdir = "/srv/work"
mode = "persistent"
[handlers."message.received"]
template = "hello {{ userId }}"
[log]
level = "debug"
"""


def test_toml_values(tmp_path: Path) -> None:
    settings = load(tmp_path, ALL_KEYS)
    assert settings.database_url == "postgresql://someone@db.example:5432/gw"
    assert settings.public_listen == Address("0.0.0.0", 9000)
    assert settings.agent_listen == Address("::1", 9001)
    assert str(settings.agent_listen) == "[::1]:9001"
    assert settings.agent_listen.is_loopback and not settings.public_listen.is_loopback
    assert settings.signing_key_file == Path("/keys/k.pem")
    assert settings.signing_algorithm == "RS256"
    assert settings.token_ttl_ms == 5000
    assert settings.scrypt == ScryptCost(log_n=12, block_size=4, parallelism=2)
    assert settings.scheduler_max_sleep_ms == 1234
    assert settings.scheduler_agent_routes is False
    assert settings.max_body_bytes == 4096
    assert settings.http_workers == 3
    assert settings.runtime_command == ("python", "-m", "agent")
    assert settings.runtime_workdir == Path("/srv/work")
    assert settings.runtime_mode == "persistent"
    assert settings.handlers == {"message.received": {"template": "hello {{ userId }}"}}
    assert settings.log_level == "DEBUG"


# (environment variable, its value, the Settings attribute path, the value it must give).
# Each beats the different value ALL_KEYS writes in the file.
OVERRIDES = [
    ("AGENT_GATEWAY_DATABASE_URL", "postgresql://other@h/x", "database_url", "postgresql://other@h/x"),
    ("AGENT_GATEWAY_PUBLIC_LISTEN", "127.0.0.2:7000", "public_listen", Address("127.0.0.2", 7000)),
    ("AGENT_GATEWAY_AGENT_LISTEN", "localhost:7001", "agent_listen", Address("localhost", 7001)),
    ("AGENT_GATEWAY_SIGNING_KEY_FILE", "/other/key.pem", "signing_key_file", Path("/other/key.pem")),
    ("AGENT_GATEWAY_SIGNING_KEY", "-----BEGIN PRIVATE KEY-----", "signing_key_pem", "-----BEGIN PRIVATE KEY-----"),
    ("AGENT_GATEWAY_SIGNING_ALGORITHM", "PS256", "signing_algorithm", "PS256"),
    ("AGENT_GATEWAY_AUTH_TOKEN_TTL_MS", "777", "token_ttl_ms", 777),
    ("AGENT_GATEWAY_DATABASE_BUSY_TIMEOUT_MS", "0", "database_busy_timeout_ms", 0),
    ("AGENT_GATEWAY_AUTH_SCRYPT_LOGN", "20", "scrypt.log_n", 20),
    ("AGENT_GATEWAY_AUTH_SCRYPT_BLOCKSIZE", "16", "scrypt.block_size", 16),
    ("AGENT_GATEWAY_AUTH_SCRYPT_PARALLELISM", "3", "scrypt.parallelism", 3),
    ("AGENT_GATEWAY_SCHEDULER_MAX_SLEEP_MS", "99", "scheduler_max_sleep_ms", 99),
    ("AGENT_GATEWAY_SCHEDULER_AGENT_ROUTES", "true", "scheduler_agent_routes", True),
    ("AGENT_GATEWAY_HTTP_MAX_BODY_BYTES", "10", "max_body_bytes", 10),
    ("AGENT_GATEWAY_HTTP_WORKERS", "64", "http_workers", 64),
    ("AGENT_GATEWAY_RUNTIME_COMMAND", '["echo", "hi"]', "runtime_command", ("echo", "hi")),
    ("AGENT_GATEWAY_RUNTIME_WORKDIR", "/other/work", "runtime_workdir", Path("/other/work")),
    ("AGENT_GATEWAY_RUNTIME_MODE", "per-run", "runtime_mode", "per-run"),
    ("AGENT_GATEWAY_HANDLERS", '{"k": {"template": "t"}}', "handlers", {"k": {"template": "t"}}),
    ("AGENT_GATEWAY_LOG_LEVEL", "warning", "log_level", "WARNING"),
]


def attribute(settings: config.Settings, dotted: str) -> object:
    value: object = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(("env", "raw", "field", "expected"), OVERRIDES, ids=[o[0] for o in OVERRIDES])
def test_environment_overrides_toml(tmp_path: Path, env: str, raw: str, field: str, expected: object) -> None:
    from_file = attribute(load(tmp_path, ALL_KEYS), field)
    assert from_file != expected
    assert attribute(load(tmp_path, ALL_KEYS, {env: raw}), field) == expected


def test_environment_works_without_a_file() -> None:
    settings = config.load(
        None, environ={"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "5", "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "4"}
    )
    assert settings.token_ttl_ms == 5
    assert settings.scrypt.log_n == 4


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[auth]\ntoken_ttl_ms = 42\n")
    assert config.load(None, environ={"AGENT_GATEWAY_CONFIG": str(path)}).token_ttl_ms == 42


def test_every_key_has_its_documented_environment_name() -> None:
    # The rule every key follows (config.py docstring): dotted path, upper case, joined by "_".
    for key in config._KEYS:
        assert key.env == "AGENT_GATEWAY_" + "_".join(key.path).upper()
    names = [key.env for key in config._KEYS]
    assert len(names) == len(set(names))
    assert "AGENT_GATEWAY_AUTH_SCRYPT_LOGN" in names


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "deployment"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = write(
        folder,
        REQUIRED
        + '[database]\nurl = "sqlite:///data/gw.db"\n'
        + '[signing]\nkey_file = "keys/signing-key.pem"\n'
        + '[runtime]\nworkdir = "workspace"\n',
    )
    settings = config.load(Path("..") / "deployment" / "gateway.toml", environ={})
    base = folder.resolve()
    assert settings.database_url == f"sqlite:///{base}/data/gw.db"
    assert settings.signing_key_file == base / "keys" / "signing-key.pem"
    assert settings.runtime_workdir == base / "workspace"
    assert path.exists()


@pytest.mark.parametrize(
    "url",
    ["sqlite:////var/lib/gw.db", "sqlite:///:memory:", "postgresql://u@h:5432/gw", "sqlite+aiosqlite:////abs.db"],
)
def test_absolute_and_non_file_urls_are_kept(tmp_path: Path, url: str) -> None:
    assert load(tmp_path, REQUIRED + f'[database]\nurl = "{url}"\n').database_url == url


def test_init_template_is_valid_and_resolves_in_its_folder(tmp_path: Path) -> None:
    from agent_gateway import deployment

    deployment.write(tmp_path / "d")
    settings = config.load(tmp_path / "d" / "gateway.toml", environ={})
    base = (tmp_path / "d").resolve()
    assert settings.database_url == f"sqlite:///{base}/gateway.db"
    assert settings.signing_key_file == base / "signing-key.pem"
    assert settings.token_ttl_ms == 2_592_000_000
    assert settings.scrypt == ScryptCost()


def refused(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingsError) as caught:
        load(tmp_path, text, environ)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_token_ttl_is_required(tmp_path: Path) -> None:
    message = refused(tmp_path, "")
    assert "auth.token_ttl_ms" in message and "AGENT_GATEWAY_AUTH_TOKEN_TTL_MS" in message
    assert "required" in message


@pytest.mark.parametrize("value", ["0", "-1", "1.5", '"abc"', "true", '""', "[1]", "2026-01-01"])
def test_bad_token_ttl(tmp_path: Path, value: str) -> None:
    assert "auth.token_ttl_ms" in refused(tmp_path, f"[auth]\ntoken_ttl_ms = {value}\n")


@pytest.mark.parametrize("value", ["-1", "1.5", '"abc"', "300001"])
def test_bad_busy_timeout(tmp_path: Path, value: str) -> None:
    assert "database.busy_timeout_ms" in refused(tmp_path, f"[database]\nbusy_timeout_ms = {value}\n")


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", "", "1e3"])
def test_bad_token_ttl_from_environment(tmp_path: Path, value: str) -> None:
    message = refused(tmp_path, REQUIRED, {"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": value})
    assert "auth.token_ttl_ms" in message and "AGENT_GATEWAY_AUTH_TOKEN_TTL_MS" in message


@pytest.mark.parametrize(
    ("name", "good", "bad"), [("logN", 20, 21), ("logN", 1, 0), ("blockSize", 1, 0), ("parallelism", 1, -1)]
)
def test_scrypt_bounds(tmp_path: Path, name: str, good: int, bad: int) -> None:
    load(tmp_path, REQUIRED + f"scrypt = {{ {name} = {good} }}\n")
    assert f"auth.scrypt.{name}" in refused(tmp_path, REQUIRED + f"scrypt = {{ {name} = {bad} }}\n")


def test_scrypt_logn_21_from_environment(tmp_path: Path) -> None:
    message = refused(tmp_path, REQUIRED, {"AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "21"})
    assert "auth.scrypt.logN" in message and "AGENT_GATEWAY_AUTH_SCRYPT_LOGN" in message


def test_max_sleep_stays_under_the_timer_ceiling(tmp_path: Path) -> None:
    ceiling = 2**31 - 1
    assert (
        load(tmp_path, REQUIRED + f"[scheduler]\nmax_sleep_ms = {ceiling - 1}\n").scheduler_max_sleep_ms == ceiling - 1
    )
    for value in (ceiling, ceiling + 1, 0, -1):
        assert "scheduler.max_sleep_ms" in refused(tmp_path, REQUIRED + f"[scheduler]\nmax_sleep_ms = {value}\n")


@pytest.mark.parametrize(
    "value",
    [
        "localhost",
        "127.0.0.1",
        "127.0.0.1:",
        ":8700",
        "127.0.0.1:port",
        "127.0.0.1:70000",
        "[::1]",
        "::1:80",
        "1.2.3.4:-1",
        "",
    ],
)
def test_bad_listen_address(tmp_path: Path, value: str) -> None:
    assert "public.listen" in refused(tmp_path, REQUIRED + f'[public]\nlisten = "{value}"\n')
    message = refused(tmp_path, REQUIRED, {"AGENT_GATEWAY_AGENT_LISTEN": value})
    assert "agent.listen" in message and "AGENT_GATEWAY_AGENT_LISTEN" in message


@pytest.mark.parametrize("value", ['"Persistent"', '"rpc"', '""', "1"])
def test_bad_runtime_mode(tmp_path: Path, value: str) -> None:
    message = refused(tmp_path, REQUIRED + f"[runtime]\nmode = {value}\n")
    assert "runtime.mode" in message and ('"per-run" or "persistent"' in message or "string" in message)


def test_listen_address_must_be_a_string(tmp_path: Path) -> None:
    assert "public.listen" in refused(tmp_path, REQUIRED + "[public]\nlisten = 8700\n")


TTL = {"AGENT_GATEWAY_AUTH_TOKEN_TTL_MS": "1"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[nonsense]\nx = 1\n", "nonsense"),
        ("[database]\nurl2 = 'x'\n", "database.url2"),
        ("[auth]\ntoken_ttl = 5\n", "auth.token_ttl"),
        ("[auth]\nscrypt = { logN = 4, cost = 2 }\n", "auth.scrypt"),
        ("[auth.scrypt]\nlogN = 4\nsalt = 'x'\n", "auth.scrypt.salt"),
        ("[database]\nextra = {}\n", "database.extra"),
        ("unknown_top = 1\n", "unknown_top"),
    ],
)
def test_unknown_table_or_key(tmp_path: Path, text: str, named: str) -> None:
    message = refused(tmp_path, text, TTL)
    assert named in message and "unknown" in message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("public = '127.0.0.1:1'\n", "public"),
        ("auth = 5\n", "auth"),
        ("log = []\n", "log"),
        ("[auth]\nscrypt = 5\n", "auth.scrypt"),
    ],
)
def test_a_known_table_written_as_a_value(tmp_path: Path, text: str, named: str) -> None:
    # Silently ignoring it would serve on the default address the operator meant to change.
    assert named in refused(tmp_path, text, TTL)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[database]\nurl = "mysql://x"\n', "database.url"),
        ('[database]\nurl = ""\n', "database.url"),
        ("[scheduler]\nagent_routes = 'maybe'\n", "scheduler.agent_routes"),
        ("[http]\nmax_body_bytes = 0\n", "http.max_body_bytes"),
        ("[http]\nworkers = 0\n", "http.workers"),
        ("[http]\nworkers = 65\n", "http.workers"),
        ("[runtime]\ncommand = []\n", "runtime.command"),
        ("[runtime]\ncommand = 'python agent.py'\n", "runtime.command"),
        ("[runtime]\ncommand = ['python', 1]\n", "runtime.command"),
        ("[log]\nlevel = 'loud'\n", "log.level"),
        ("[handlers]\nk = 1\n", "handlers"),
        ("[signing]\nkey_file = ''\n", "signing.key_file"),
    ],
)
def test_bad_values_name_the_setting(tmp_path: Path, text: str, named: str) -> None:
    assert named in refused(tmp_path, REQUIRED + text)


def test_bad_toml(tmp_path: Path) -> None:
    message = refused(tmp_path, "[auth\ntoken_ttl_ms = ")
    assert "config" in message and "gateway.toml" in message and "TOML" in message


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_bytes(b"[auth]\ntoken_ttl_ms = 1\n# \xff\n")
    with pytest.raises(SettingsError, match="gateway.toml"):
        config.load(path, environ={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="no such file") as caught:
        config.load(tmp_path / "absent.toml", environ={})
    assert "absent.toml" in str(caught.value)
    with pytest.raises(SettingsError, match="absent.toml"):
        config.load(None, environ={"AGENT_GATEWAY_CONFIG": str(tmp_path / "absent.toml")})
