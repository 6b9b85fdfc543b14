"""What an operator sees when something is wrong: one line, and no database harmed by accident."""

from __future__ import annotations

import asyncio
import os
import stat
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from agent_gateway import deployment
from tests import served
from tests.cli.test_main import one_error_line, run_all
from tests.conftest import POSTGRES_URL

pytestmark = pytest.mark.processes

COMMANDS = [("users", "list"), ("tokens", "revoke", "3f2504e0-4f89-41d3-9a0c-0305e82c3301"), ("schedules", "list")]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    deployment.write(tmp_path / "d")
    return tmp_path / "d"


def cli(folder: Path, *args: str, url: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``agent-gateway ARGS`` on the database ``url``: in this process (``served.run_cli_here``),
    but ``serve``, which sets up logging and servers, in a process of its own."""
    run = served.run_cli if args[:1] == ("serve",) else served.run_cli_here
    return run(*args, config=folder / "gateway.toml", env={"AGENT_GATEWAY_DATABASE_URL": url}, input=input)


def unreachable_urls(tmp_path: Path) -> list[tuple[str, str]]:
    """(database.url, what the one line must say) for each way of not reaching a database."""
    base = POSTGRES_URL.rpartition("/")[0]
    return [
        (f"postgresql://postgres:s3cret@127.0.0.1:{served.free_port()}/test", "cannot connect"),
        (f"{base}/agw_no_such_database_{uuid.uuid4().hex[:8]}", "does not exist"),
        ("postgresql://agw_no_such_role:s3cret@127.0.0.1:5432/test", "agw_no_such_role"),
        ("postgresql://postgres@no-such-host.invalid:5432/test", "cannot connect"),
        (f"sqlite:///{tmp_path}/no-such-folder/gateway.db", "no-such-folder"),
    ]


@pytest.mark.parametrize("command", [("users", "list"), ("migrate",), ("serve",)])
def test_a_database_that_cannot_be_reached_is_one_line_naming_the_url(
    folder: Path, tmp_path: Path, command: tuple[str, ...]
) -> None:
    for url, said in unreachable_urls(tmp_path):
        result = cli(folder, *command, url=url)
        line = one_error_line(result)
        assert result.returncode == 1
        assert "database.url " in line and said in line, (url, line)
        assert "s3cret" not in line and "s3cret" not in result.stderr
        if "s3cret" in url:
            assert "***" in line


def test_a_command_on_a_missing_sqlite_file_creates_nothing(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    for command in COMMANDS:
        line = one_error_line(cli(folder, *command, url=f"sqlite:///{path}"))
        assert "run agent-gateway migrate" in line
    assert list(tmp_path.glob("typo.db*")) == []


def test_a_command_on_an_empty_database_says_to_migrate_and_changes_nothing(folder: Path, empty_database_url: str) -> None:
    if empty_database_url.startswith("sqlite"):
        Path(empty_database_url.removeprefix("sqlite:///")).touch()  # an empty file: an empty database
    for command in COMMANDS:
        line = one_error_line(cli(folder, *command, url=empty_database_url))
        assert "no gateway schema" in line and "run agent-gateway migrate" in line
    assert tables_of(empty_database_url) == []


def test_migrate_creates_then_is_up_to_date(folder: Path, empty_database_url: str) -> None:
    for said in ("created the schema", "up to date"):
        result = cli(folder, "migrate", url=empty_database_url)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(said)
    result = cli(folder, "users", "list", url=empty_database_url)
    assert result.returncode == 0 and result.stdout.strip() == "[]"


def test_a_database_that_is_not_a_gateway_s_is_refused_unless_forced(folder: Path, empty_database_url: str) -> None:
    run_sql(empty_database_url, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    for command in [*COMMANDS, ("migrate",), ("serve",)]:
        line = one_error_line(cli(folder, *command, url=empty_database_url))
        assert "not an agent-gateway database" in line and "invoices" in line, (command, line)
    assert tables_of(empty_database_url) == ["invoices"]
    result = cli(folder, "migrate", "--force", url=empty_database_url)
    assert result.returncode == 0 and result.stdout.startswith("created the schema"), result.stderr
    assert "invoices" in tables_of(empty_database_url) and "decisions" in tables_of(empty_database_url)


def test_a_database_of_a_newer_version_is_refused(folder: Path, database_url: str) -> None:
    run_sql(database_url, "UPDATE alembic_version SET version_num = '9999'")
    for command in [*COMMANDS, ("migrate",)]:
        line = one_error_line(cli(folder, *command, url=database_url))
        assert "9999" in line and "newer" in line


def test_the_sqlite_database_and_its_wal_are_the_owner_s_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'gateway.db'}"
    (tmp_path / "fresh").mkdir()
    with served.ServedGateway.start(tmp_path / "d", url) as gateway:
        assert gateway.cli("users", "add").returncode == 0
        files = sorted((tmp_path / "fresh").glob("gateway.db*"))
        assert {f.name for f in files} >= {"gateway.db", "gateway.db-wal", "gateway.db-shm"}
        for file in files:
            if file.suffix != ".serve-lock":
                assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    (tmp_path / "other").mkdir()
    other = tmp_path / "other" / "gateway.db"
    assert cli(tmp_path / "d", "migrate", url=f"sqlite:///{other}").returncode == 0
    assert stat.S_IMODE(other.stat().st_mode) == 0o600


def test_usage_errors_are_one_line_with_status_2(tmp_path: Path) -> None:
    cases = [
        ("users", "lst"),
        ("users", "list", "--limit", "x"),
        ("users", "list", "--bogus"),
        ("schedules", "put"),
        ("nonsense",),
    ]

    def run(args: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess[str]]:
        return args, served.run_cli(*args, config=tmp_path / "absent.toml")

    for args, result in run_all(cases, run):  # type: ignore[misc]
        one_error_line(result)
        assert result.returncode == 2, (args, result.stderr)


def test_version(tmp_path: Path) -> None:
    result = served.run_cli("--version", config=tmp_path / "absent.toml")
    assert result.returncode == 0 and result.stdout.startswith("agent-gateway ")


def test_no_configuration_at_all_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_GATEWAY_")}
    env["PYTHONPATH"] = str(served.SRC)
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "users", "list"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert "no configuration: pass --config or set AGENT_GATEWAY_CONFIG" in one_error_line(result)


def test_an_error_in_the_file_names_the_key_once(folder: Path) -> None:
    config = folder / "gateway.toml"
    config.write_text(config.read_text().replace("token_ttl_ms = ", "token_ttl_ms = -"))
    line = one_error_line(served.run_cli("users", "list", config=config))
    assert "auth.token_ttl_ms: must be" in line and line.count("auth.token_ttl_ms") == 1


def test_set_password_from_a_pipe_needs_password_stdin(folder: Path, database_url: str) -> None:
    user = cli(folder, "users", "add", url=database_url)
    user_id = user.stdout.split('"id": "')[1].split('"')[0]
    result = cli(folder, "users", "set-password", user_id, url=database_url, input="hunter2\nhunter2\n")
    line = one_error_line(result)
    assert "--password-stdin" in line and "Warning" not in result.stderr


# --- helpers ---------------------------------------------------------------------


def run_sql(url: str, sql: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql)
        return
    asyncio.run(_pg(url, sql))


def tables_of(url: str) -> list[str]:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if not Path(path).exists():
            return []
        with sqlite3.connect(path) as conn:
            return sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    rows = asyncio.run(_pg(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'", fetch=True))
    return sorted(row[0] for row in rows)


async def _pg(url: str, sql: str, fetch: bool = False) -> list:
    conn = await asyncpg.connect(url, timeout=60)
    try:
        return await conn.fetch(sql) if fetch else (await conn.execute(sql), [])[1]
    finally:
        await conn.close()

