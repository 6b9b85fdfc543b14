"""The operator's command line, run as a real subprocess (cli/, deployment.py); every help text in process."""

from __future__ import annotations

import concurrent.futures
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway import config, deployment
from agent_gateway.cli.main import app
from tests.served import run_cli, run_cli_here

pytestmark = pytest.mark.processes

NOBODY = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """A failed command: non-zero exit, nothing on stdout, exactly one line on stderr."""
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agent-gateway: error: ")
    return lines[0]


class Cli:
    """``agent-gateway`` against one deployment folder and database."""

    def __init__(self, folder: Path, database_url: str) -> None:
        self.config = folder / "gateway.toml"
        self.env = {"AGENT_GATEWAY_DATABASE_URL": database_url}

    def __call__(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """The command in a process of its own, as an operator runs it."""
        return run_cli(*args, config=self.config, input=input, env=self.env)

    def json(self, *args: str, input: str | None = None, process: bool = False) -> object:
        """The command's JSON answer: in this process (``run_cli_here``) unless ``process``."""
        run = run_cli if process else run_cli_here
        result = run(*args, config=self.config, input=input, env=self.env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)  # the standard library keeps big integers exact


@pytest.fixture
def cli(tmp_path: Path, database_url: str) -> Cli:
    deployment.write(tmp_path / "deployment")
    return Cli(tmp_path / "deployment", database_url)


def run_all(cases: list[tuple[object, ...]], run: object) -> list[object]:
    """Run independent subprocess cases side by side (each start costs a second or two)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(run, cases))  # type: ignore[arg-type]


# --- init --------------------------------------------------------------------


def test_init_writes_a_config_and_a_private_key(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "deployment"
    result = run_cli("init", str(folder), config=tmp_path / "unused.toml")
    assert result.returncode == 0, result.stderr
    config_file, key_file = folder / "gateway.toml", folder / "signing-key.pem"
    assert str(config_file) in result.stdout and str(key_file) in result.stdout
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    assert key_file.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    settings = config.load(config_file, environ={})
    assert settings.signing_key_file == key_file.resolve()
    # The demo echo agent, kept warm by the persistent runtime.
    assert settings.runtime_command == (sys.executable, "-m", "agent_gateway.runtimes.echo")
    assert settings.runtime_mode == "persistent"


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    folder = tmp_path / "deployment"
    assert run_cli("init", str(folder), config=tmp_path / "unused.toml").returncode == 0
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    line = one_error_line(run_cli("init", str(folder), config=tmp_path / "unused.toml"))
    assert "exists" in line
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


@pytest.mark.parametrize("present", ["gateway.toml", "signing-key.pem"])
def test_init_writes_nothing_when_either_file_exists(tmp_path: Path, present: str) -> None:
    folder = tmp_path / "deployment"
    folder.mkdir()
    (folder / present).write_text("mine\n")
    line = one_error_line(run_cli("init", str(folder), config=tmp_path / "unused.toml"))
    assert present in line
    assert [path.name for path in folder.iterdir()] == [present]
    assert (folder / present).read_text() == "mine\n"


# --- users ---------------------------------------------------------------------


def test_users_add_list_show(cli: Cli) -> None:
    assert cli.json("users", "list", process=True) == []
    first = cli.json("users", "add", process=True)
    second = cli.json("users", "add")
    assert isinstance(first, dict) and isinstance(second, dict)
    assert list(first) == ["id", "attributes", "createdAt"] and first["attributes"] == {}
    assert first["id"] != second["id"]
    assert cli.json("users", "list") == [second, first]
    assert cli.json("users", "list", "--limit", "1") == [second]
    assert cli.json("users", "show", first["id"]) == first
    assert cli.json("users", "show", first["id"].upper()) == first


def test_users_set_attributes(cli: Cli) -> None:
    user = cli.json("users", "add")
    assert isinstance(user, dict)
    text = '{"team": "blue", "roles": ["a", "b"], "n": 123456789012345678901234567890, "x": null}'
    updated = cli.json("users", "set-attributes", user["id"], text, process=True)
    assert updated == {**user, "attributes": json.loads(text)}
    assert cli.json("users", "show", user["id"]) == updated
    # "-" reads the value from stdin; any JSON value, null included.
    for value in ('["from", "stdin", 1.5]', "null", '"text"', "false"):
        updated = cli.json("users", "set-attributes", user["id"], "-", input=value)
        assert updated == {**user, "attributes": json.loads(value)}
    assert cli.json("users", "show", user["id"]) == {**user, "attributes": False}


def test_users_errors_are_one_line(cli: Cli) -> None:
    user = cli.json("users", "add")
    assert isinstance(user, dict)
    # (arguments, stdin, what the one line must say)
    cases = [
        (("users", "show", "not-a-uuid"), None, "UUID"),
        (("users", "show", NOBODY), None, "No User"),
        (("users", "set-attributes", NOBODY, "{}"), None, "No User"),
        (("users", "set-attributes", "nope", "{}"), None, "UUID"),
        (("users", "set-attributes", user["id"], "-"), "[1,", "JSON"),
        *((("users", "set-attributes", user["id"], bad), None, "JSON") for bad in ("{", "NaN", "{'a': 1}", "")),
    ]

    for args, stdin, expected in cases:
        assert expected in one_error_line(run_cli_here(*args, config=cli.config, input=stdin, env=cli.env)), args
    # Nothing above changed the User.
    assert cli.json("users", "show", user["id"]) == user


# --- configuration errors ---------------------------------------------------------


def test_a_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[auth\n")
    no_ttl = tmp_path / "no-ttl.toml"
    no_ttl.write_text("[log]\nlevel = 'INFO'\n")
    deployment.write(tmp_path / "d")
    good = tmp_path / "d" / "gateway.toml"
    # (config file, extra environment, what the one line must name)
    configs = [
        (missing, {}, "absent.toml"),
        (bad_toml, {}, "TOML"),
        (no_ttl, {}, "auth.token_ttl_ms"),
        (good, {"AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "21"}, "auth.scrypt.logN"),
        (good, {"AGENT_GATEWAY_PUBLIC_LISTEN": "nowhere"}, "public.listen"),
    ]
    # Every bad config on one command, and each other command with a different one.
    others = [
        ("users", "add"),
        ("users", "show", NOBODY),
        ("migrate",),
        ("serve",),
        ("users", "set-attributes", NOBODY, "{}"),
    ]
    cases = [(("users", "list"), *case) for case in configs] + [(c, *case) for c, case in zip(others, configs)]

    def run(case: tuple) -> tuple[tuple, subprocess.CompletedProcess[str]]:
        command, path, env, _ = case
        return case, run_cli(*command, config=path, env=env)

    for (command, _, _, named), result in run_all(cases, run):  # type: ignore[misc]
        assert named in one_error_line(result), (command, named)
    assert not (tmp_path / "gateway.db").exists() and not (tmp_path / "d" / "gateway.db").exists()


def test_the_config_option_wins_over_the_environment(tmp_path: Path) -> None:
    deployment.write(tmp_path / "d")
    option = ("--config", str(tmp_path / "d" / "gateway.toml"))
    assert run_cli("migrate", *option, config=tmp_path / "absent.toml").returncode == 0
    assert (tmp_path / "d" / "gateway.db").exists()  # relative to the config file, not the working folder
    result = run_cli("users", "list", *option, config=tmp_path / "absent.toml")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# --- --help everywhere -----------------------------------------------------------


def _command_paths(command: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``command`` (Typer vendors its own click, so no isinstance)."""
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def test_help_works_on_every_command_and_group(tmp_path: Path) -> None:
    assert {("init",), ("serve",), ("migrate",), ("users",), ("users", "add"), ("users", "set-attributes")} <= set(
        COMMANDS
    )
    # The console script itself, as a newcomer first runs it.
    result = run_cli("--help", config=tmp_path / "absent.toml")
    assert result.returncode == 0 and "Usage: python -m agent_gateway [OPTIONS] COMMAND" in " ".join(result.stdout.split())
    # Every command's and group's help, in this process: what is tested is the help text, and
    # dozens of interpreter starts would cost the suite a minute of CPU for nothing more.
    failed = []
    for path in COMMANDS:
        help_result = CliRunner().invoke(app, [*path, "--help"], prog_name="agent-gateway", env={"AGENT_GATEWAY_CONFIG": str(tmp_path / "absent.toml")})
        if help_result.exit_code != 0:
            failed.append((" ".join(path), help_result.stderr))
            continue
        usage = " ".join(help_result.stdout.split())
        assert re.search(r"Usage: agent-gateway " + re.escape(" ".join((*path, "[OPTIONS]"))), usage), path
    assert failed == []

def test_a_command_imports_no_server_framework() -> None:
    """A command's start is its imports: the command line leaves out what only ``serve`` needs
    (FastAPI, uvicorn, the MCP SDK: about a third of a command's CPU when a proof's helper was
    imported from the routes), and pydantic, whose models only ``verify-receipt`` builds (a
    quarter of every other command's import CPU)."""
    heavy = ("fastapi", "uvicorn", "mcp", "pydantic")
    probe = f"import sys, agent_gateway.cli.main; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
