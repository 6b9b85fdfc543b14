"""The confinement settings (runtime.sandbox, sandbox_ro, sandbox_rw, allow_hosts, env_pass,
memory_limit_mb, max_processes): defaults, TOML and environment values, one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.config import Address, SettingsError
from agent_gateway.sandbox import choose

REQUIRED = "[auth]\ntoken_ttl_ms = 1000\n"


def load(tmp_path: Path, runtime: str = "", environ: dict[str, str] | None = None) -> config.Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(REQUIRED + "[runtime]\n" + runtime, encoding="utf-8")
    return config.load(path, environ=environ or {})


def test_defaults_confine_when_possible_with_no_egress(tmp_path: Path) -> None:
    settings = load(tmp_path)
    assert settings.runtime_sandbox == "auto"
    assert (settings.runtime_sandbox_ro, settings.runtime_sandbox_rw) == ((), ())
    assert (settings.runtime_allow_hosts, settings.runtime_env_pass) == ((), ())
    assert (settings.runtime_memory_limit_mb, settings.runtime_max_processes) == (4096, 1024)


def test_values_from_toml_and_relative_paths_from_the_config_folder(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        'sandbox = "bubblewrap"\nsandbox_ro = ["models", "/opt/tools"]\nsandbox_rw = ["cache"]\n'
        'allow_hosts = ["api.example.com:443", "[2001:db8::1]:8443"]\nenv_pass = ["OPENAI_API_KEY"]\n'
        "memory_limit_mb = 512\nmax_processes = 64\n",
    )
    assert settings.runtime_sandbox == "bubblewrap"
    assert settings.runtime_sandbox_ro == (tmp_path.resolve() / "models", Path("/opt/tools"))
    assert settings.runtime_sandbox_rw == (tmp_path.resolve() / "cache",)
    assert settings.runtime_allow_hosts == (Address("api.example.com", 443), Address("2001:db8::1", 8443))
    assert settings.runtime_env_pass == ("OPENAI_API_KEY",)
    assert (settings.runtime_memory_limit_mb, settings.runtime_max_processes) == (512, 64)
    assert settings.config_file == (tmp_path / "gateway.toml").resolve()


def test_environment_overrides(tmp_path: Path) -> None:
    settings = load(tmp_path, 'sandbox = "bubblewrap"\n', {
        "AGENT_GATEWAY_RUNTIME_SANDBOX": "none",
        "AGENT_GATEWAY_RUNTIME_ALLOW_HOSTS": '["127.0.0.1:11434"]',
        "AGENT_GATEWAY_RUNTIME_ENV_PASS": '["A_KEY", "B"]',
        "AGENT_GATEWAY_RUNTIME_SANDBOX_RW": '["/srv/agent"]',
        "AGENT_GATEWAY_RUNTIME_MAX_PROCESSES": "100",
    })
    assert settings.runtime_sandbox == "none"
    assert settings.runtime_allow_hosts == (Address("127.0.0.1", 11434),)
    assert settings.runtime_env_pass == ("A_KEY", "B")
    assert settings.runtime_sandbox_rw == (Path("/srv/agent"),)
    assert settings.runtime_max_processes == 100


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ('sandbox = "docker"\n', 'runtime.sandbox: must be "auto", "bubblewrap" or "none"'),
        ("sandbox = true\n", "runtime.sandbox: must be a non-empty string"),
        ('sandbox_ro = "/opt"\n', "runtime.sandbox_ro: must be a list"),
        ('sandbox_rw = [""]\n', "runtime.sandbox_rw: each entry must be a non-empty string"),
        ('allow_hosts = ["api.example.com"]\n', 'runtime.allow_hosts: each entry must be "host:port"'),
        ('allow_hosts = ["api.example.com:0"]\n', 'runtime.allow_hosts: each entry must be "host:port" with a port 1..65535'),
        ('allow_hosts = ["api.example.com:70000"]\n', "runtime.allow_hosts: each entry port must be 0..65535"),
        ('env_pass = ["OPENAI API KEY"]\n', "runtime.env_pass: each entry must be an environment variable name"),
        ("memory_limit_mb = 8\n", "runtime.memory_limit_mb: must be at least 16"),
        ("max_processes = 0\n", "runtime.max_processes: must be at least 8"),
        ('max_processes = "many"\n', "runtime.max_processes: must be an integer"),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, runtime: str, message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load(tmp_path, runtime)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_a_bad_environment_value_names_its_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as refused:
        load(tmp_path, environ={"AGENT_GATEWAY_RUNTIME_ALLOW_HOSTS": "api.example.com:443"})
    assert str(refused.value) == (
        "runtime.allow_hosts (AGENT_GATEWAY_RUNTIME_ALLOW_HOSTS): must be a list (in an environment variable, a JSON list)"
    )


def test_the_gateways_secrets_are_its_config_folder_key_and_database_files(tmp_path: Path) -> None:
    settings = load(tmp_path, environ={
        "AGENT_GATEWAY_SIGNING_KEY_FILE": "/etc/agent-gateway/key.pem",
        "AGENT_GATEWAY_DATABASE_URL": "sqlite:////var/lib/agent-gateway/gateway.db",
    })
    assert choose.protected(settings) == [
        (tmp_path / "gateway.toml").resolve(), tmp_path.resolve(), Path("/etc/agent-gateway/key.pem"),
        *(Path("/var/lib/agent-gateway") / f"gateway.db{suffix}" for suffix in ("", "-wal", "-shm", "-journal", ".serve-lock")),
    ]
