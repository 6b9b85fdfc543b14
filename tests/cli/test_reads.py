"""``agent-gateway signals|runs|messages|decisions``: the operator's reads, in process, on both backends."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.cli.conftest import Recorded, run, run_json
from tests.served import run_cli

pytestmark = pytest.mark.processes

NOBODY = str(uuid.uuid4())


def test_signals_list_filters_and_show(config_file: Path, recorded: Recorded) -> None:
    done, failed, tick = recorded.signal_ids
    listed = run_json(config_file, "signals", "list")
    assert [signal["id"] for signal in listed] == [tick, failed, done]
    assert [s["id"] for s in run_json(config_file, "signals", "list", "--state", "pending")] == [tick]
    assert [s["id"] for s in run_json(config_file, "signals", "list", "--state", "failed")] == [failed]
    assert [s["id"] for s in run_json(config_file, "signals", "list", "--kind", "tick")] == [tick]
    assert run_json(config_file, "signals", "list", "--kind", "message.received", "--state", "done", "--limit", "1") == [
        listed[2]
    ]
    assert run_json(config_file, "signals", "list", "--kind", "nothing") == []
    shown = run_json(config_file, "signals", "show", failed.upper())
    assert shown == listed[1] and shown["state"] == "failed" and shown["error"] == "it broke"


def test_runs_list_filters_and_show(config_file: Path, recorded: Recorded) -> None:
    done_run, failed_run = recorded.run_ids
    done_signal, failed_signal, pending_signal = recorded.signal_ids
    assert {run["id"] for run in run_json(config_file, "runs", "list")} == {done_run, failed_run}
    assert [r["id"] for r in run_json(config_file, "runs", "list", "--signal", failed_signal)] == [failed_run]
    assert [r["id"] for r in run_json(config_file, "runs", "list", "--state", "done")] == [done_run]
    assert run_json(config_file, "runs", "list", "--signal", done_signal, "--state", "failed") == []
    assert run_json(config_file, "runs", "list", "--signal", pending_signal) == []
    assert len(run_json(config_file, "runs", "list", "--limit", "1")) == 1
    shown = run_json(config_file, "runs", "show", failed_run)
    assert shown["signalId"] == failed_signal and shown["state"] == "failed" and shown["error"] == "it broke"


def test_messages_list_windows(config_file: Path, recorded: Recorded) -> None:
    log = run_json(config_file, "messages", "list", "--user", recorded.user_id)
    assert [(m["seq"], m["direction"], m["text"]) for m in log] == [
        (1, "inbound", "first question"),
        (2, "inbound", "second question"),
        (3, "outbound", "an answer"),
    ]
    assert run_json(config_file, "messages", "list", "--user", recorded.user_id, "--after", "1", "--limit", "1") == [log[1]]
    assert run_json(config_file, "messages", "list", "--user", recorded.user_id, "--before", "3") == log[:2]
    assert run_json(config_file, "messages", "list", "--user", recorded.user_id, "--limit", "2") == log[1:]


def test_decisions_list_windows_and_show(config_file: Path, recorded: Recorded) -> None:
    log = run_json(config_file, "decisions", "list")
    assert [(d["seq"], d["statement"]) for d in log] == [(1, "one"), (2, "two")]
    assert set(log[0]) == {"seq", "statement", "jws", "createdAt"}
    assert run_json(config_file, "decisions", "list", "--after", "1") == log[1:]
    assert run_json(config_file, "decisions", "list", "--before", "2") == log[:1]
    assert run_json(config_file, "decisions", "list", "--limit", "1") == log[1:]
    assert run_json(config_file, "decisions", "show", "2") == log[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["signals", "show", NOBODY], "No Signal has that id."),
        (["signals", "show", "not-a-uuid"], "id must be a UUID"),
        (["runs", "show", NOBODY], "No Run has that id."),
        (["runs", "list", "--signal", "nope"], "--signal must be a UUID"),
        (["messages", "list", "--user", NOBODY], "No User has that id."),
        (["messages", "list", "--user", "nope"], "--user must be a UUID"),
        (["decisions", "show", "99"], "No Decision has that number."),
    ],
)
def test_unknown_or_malformed_ids_are_one_line(config_file: Path, recorded: Recorded, args: list[str], message: str) -> None:
    result = run(config_file, *args)
    assert result.exit_code == 1
    assert result.stderr == f"agent-gateway: error: {message}\n" and result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["signals", "list", "--state", "running"],
        ["signals", "list", "--limit", "0"],
        ["runs", "list", "--state", "processing"],
        ["messages", "list"],
        ["messages", "list", "--user", NOBODY, "--after", "1", "--before", "3"],
        ["messages", "list", "--user", NOBODY, "--limit", "201"],
        ["decisions", "list", "--after", "-1"],
        ["decisions", "list", "--after", "1", "--before", "3"],
        ["decisions", "show", "0"],
        ["decisions", "show", "x"],
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    # The console script (one line, exit 2), refusing before any setting or database is read.
    result = run_cli(*args, config=tmp_path / "missing.toml")
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and result.stderr.startswith("agent-gateway: error: ")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args", [["signals", "list"], ["runs", "show", NOBODY], ["messages", "list", "--user", NOBODY], ["decisions", "list"]]
)
def test_reads_need_a_current_schema(tmp_path: Path, args: list[str]) -> None:
    database = tmp_path / "never-migrated.db"
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(f'[database]\nurl = "sqlite:///{database}"\n\n[auth]\ntoken_ttl_ms = 60000\n')
    result = run(config_file, *args)
    assert result.exit_code == 1 and "agent-gateway migrate" in result.stderr
    assert not database.exists()
