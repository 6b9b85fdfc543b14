"""``agent-gateway keys show``: the checkpoints' origin and verifier key, and the JWK Set."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agent_gateway import config, deployment
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.transparency import note
from tests.served import run_cli, run_cli_here

pytestmark = pytest.mark.processes


def test_keys_show_prints_the_origin_and_the_vkey_of_the_deployment_s_key(tmp_path: Path) -> None:
    deployment.write(tmp_path / "d")
    gateway_toml = tmp_path / "d" / "gateway.toml"
    result = run_cli("keys", "show", config=gateway_toml)
    assert result.returncode == 0, result.stderr
    shown = orjson.loads(result.stdout)
    identity = SigningIdentity.from_settings(config.load(gateway_toml, environ={}))
    assert shown["jwks"] == identity.jwks()
    assert shown["origin"].startswith("agent-gateway/decisions/")
    [key] = note.note_keys(shown["origin"], shown["jwks"]["keys"][0])
    assert shown["vkey"] == key.vkey() and shown["vkey"].startswith(shown["origin"] + "+")
    # The Run ledger's, which a witness is configured with too: its own origin, the same key.
    ledger = shown["ledger"]
    assert ledger["origin"] == "agent-gateway/ledger/" + shown["origin"].removeprefix("agent-gateway/decisions/")
    [ledger_key] = note.note_keys(ledger["origin"], shown["jwks"]["keys"][0])
    assert ledger["vkey"] == ledger_key.vkey() and ledger["vkey"].startswith(ledger["origin"] + "+")
    # The same deployment shows the same origin every time; the setting replaces it (these in this
    # process: the command's real start is the one above).
    assert orjson.loads(run_cli_here("keys", "show", config=gateway_toml).stdout)["origin"] == shown["origin"]
    named = run_cli_here("keys", "show", config=gateway_toml, env={"AGENT_GATEWAY_TRANSPARENCY_ORIGIN": "example.com/log"})
    assert orjson.loads(named.stdout)["origin"] == "example.com/log"
    assert orjson.loads(named.stdout)["ledger"]["origin"] == "example.com/log/ledger"
    bad = run_cli_here("keys", "show", config=gateway_toml, env={"AGENT_GATEWAY_TRANSPARENCY_ORIGIN": "a b"})
    assert bad.returncode == 1 and "transparency.origin" in bad.stderr
