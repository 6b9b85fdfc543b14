"""``agent-gateway schedules``, in process, on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from agent_gateway.cli.main import app

FUTURE = "2099-01-01T00:00:00Z"


@pytest.fixture
def config_file(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n\n[auth]\ntoken_ttl_ms = 60000\n')
    return path


def run(config_file: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, ["schedules", *args, "--config", str(config_file)], input=input)


def run_json(config_file: Path, *args: str, input: str | None = None) -> Any:
    result = run(config_file, *args, input=input)
    assert result.exit_code == 0, result.stderr
    return orjson.loads(result.stdout)


def test_put_list_show_delete(config_file: Path) -> None:
    once = run_json(config_file, "put", "once", "--at", "2099-01-01T01:00:00+01:00")
    assert once == {
        "name": "once",
        "spec": {"kind": "once", "at": "2099-01-01T00:00:00.000Z"},
        "data": None,
        "until": None,
        "nextFireAt": "2099-01-01T00:00:00.000Z",
    }
    cron = run_json(
        config_file, "put", "cron", "--cron", "0 9 * * MON", "--until", "2098-06-01T00:00:00Z", "--data", '{"k": [1]}'
    )
    assert cron["spec"] == {"kind": "cron", "expr": "0 9 * * MON", "tz": "UTC"}
    assert cron["until"] == "2098-06-01T00:00:00.000Z" and cron["data"] == {"k": [1]}
    assert run_json(config_file, "list") == [cron, once]
    assert run_json(config_file, "list", "--limit", "1") == [cron]
    assert run_json(config_file, "show", "once") == once

    replaced = run_json(
        config_file, "put", "once", "--cron", "@daily", "--tz", "Pacific/Auckland", "--data", "-", input='"from stdin"'
    )
    assert replaced["spec"] == {"kind": "cron", "expr": "@daily", "tz": "Pacific/Auckland"}
    assert replaced["data"] == "from stdin"
    assert run_json(config_file, "show", "once") == replaced

    deleted = run(config_file, "delete", "once")
    assert deleted.exit_code == 0 and deleted.stdout == ""
    assert [schedule["name"] for schedule in run_json(config_file, "list")] == ["cron"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["put", "bad name", "--at", FUTURE], "name"),
        (["put", "x" * 129, "--at", FUTURE], "name"),
        (["put", "x", "--cron", "every day"], "spec.expr"),
        (["put", "x", "--cron", "@daily", "--tz", "Mars/Olympus"], "spec.tz"),
        (["put", "x", "--cron", "@daily", "--tz", ""], "spec.tz"),
        (["put", "x", "--cron", "@daily", "--until", "next year"], "until"),
        (["put", "x", "--cron", "@daily", "--until", "2000-01-01T00:00:00Z"], "until"),
        (["put", "x", "--at", FUTURE, "--until", "2099-01-02T00:00:00Z"], "until"),
        (["put", "x", "--at", "2000-01-01T00:00:00Z"], "past"),
        (["put", "x", "--at", "2099-01-01T00:00:00"], "spec.at"),
        (["put", "x", "--at", FUTURE, "--tz", "UTC"], "'tz'"),
        (["put", "x"], "--at or --cron"),
        (["put", "x", "--at", FUTURE, "--cron", "@daily"], "--at or --cron"),
        (["put", "x", "--at", FUTURE, "--data", "{oops"], "data"),
        (["show", "absent"], "no live Schedule"),
        (["delete", "absent"], "no live Schedule"),
        (["show", "a b"], "name"),
        (["delete", "a b"], "name"),
    ],
)
def test_refusals_are_one_line_and_store_nothing(config_file: Path, args: list[str], message: str) -> None:
    result = run(config_file, *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("agent-gateway: error:") and message in line, line
    assert run_json(config_file, "list") == []
