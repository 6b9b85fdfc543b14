"""``agent-gateway prune``, in process, on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Recorded, run_json
from tests.served import run_cli

pytestmark = pytest.mark.processes


def test_prune_dry_run_then_for_real(config_file: Path, recorded: Recorded) -> None:
    done, failed, tick = recorded.signal_ids
    messages = run_json(config_file, "messages", "list", "--user", recorded.user_id)
    decisions = run_json(config_file, "decisions", "list")

    # Everything here was emitted moments ago.
    assert run_json(config_file, "prune", "--before", "30d") | {"before": None} == {
        "before": None, "signals": 0, "runs": 0, "deliveries": 0, "channelDeliveries": 0, "dryRun": False
    }
    dry = run_json(config_file, "prune", "--before", "0s", "--dry-run")
    assert (dry["signals"], dry["runs"], dry["dryRun"]) == (2, 2, True)
    assert len(run_json(config_file, "signals", "list")) == 3

    pruned = run_json(config_file, "prune", "--before", "0s")
    assert (pruned["signals"], pruned["runs"], pruned["dryRun"]) == (2, 2, False)
    assert pruned["before"].endswith("Z")
    assert [signal["id"] for signal in run_json(config_file, "signals", "list")] == [tick]
    assert run_json(config_file, "runs", "list") == []
    assert run_json(config_file, "runs", "list", "--signal", done) == []
    assert run_json(config_file, "messages", "list", "--user", recorded.user_id) == messages
    assert run_json(config_file, "decisions", "list") == decisions


@pytest.mark.parametrize("args", [[], ["--before"], ["--before", "30"], ["--before", "1y"], ["--before", "-1d"]])
def test_bad_ages_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    result = run_cli("prune", *args, config=tmp_path / "missing.toml")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("agent-gateway: error: ") and result.stderr.count("\n") == 1
