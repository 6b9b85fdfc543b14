"""``agent-gateway audit`` against a real ``serve``: it passes on an honest log and names what was rewritten."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import orjson
import pytest

from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.store.queries.tree import key
from tests.cli.test_main import one_error_line
from tests.cli.test_operator_errors import run_sql
from tests.served import ServedGateway, run_cli, run_cli_here

pytestmark = pytest.mark.processes


def audit(
    gateway: ServedGateway, *args: str, token: str | None = None, url: str | None = None, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """The audit as a third party runs it: no configuration, no database, just the URL; in this
    process (the command's own code, without an interpreter start each time) unless ``process``."""
    if token is not None:
        args = (*args, "--token-stdin")
    run = run_cli if process else run_cli_here
    return run("audit", url or gateway.public_url, *args, config=gateway.directory / "none.toml", input=token)


def publish(gateway: ServedGateway, count: int) -> list[dict]:
    published = []
    for index in range(count):
        response = httpx.post(f"{gateway.agent_url}/decisions", json={"statement": f"decided {index}"}, timeout=60)
        assert response.status_code == 201, response.text
        published.append(response.json())
    return published


def token_of_a_user(gateway: ServedGateway) -> str:
    user = gateway.cli_json("users", "add")
    return gateway.cli_json("tokens", "issue", user["id"])["token"]


def audited(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def test_an_honest_log_audits_from_nothing_and_then_only_what_is_new(served_gateway: ServedGateway, tmp_path: Path) -> None:
    gateway = served_gateway
    token = token_of_a_user(gateway)
    state = tmp_path / "audit-state.json"
    empty = audited(audit(gateway, "--state", str(state), token=token, process=True))
    assert (empty["treeSize"], empty["audited"]) == (0, 0)
    publish(gateway, 5)
    first = audited(audit(gateway, "--state", str(state), token=token))
    assert (first["treeSize"], first["audited"]) == (5, 5) and first["origin"] == empty["origin"]
    publish(gateway, 3)
    second = audited(audit(gateway, "--state", str(state), token=token))
    assert (second["treeSize"], second["audited"]) == (8, 3)
    again = audited(audit(gateway, "--state", str(state), token=token))
    assert again["audited"] == 0 and again["rootHash"] == second["rootHash"]
    # The Agent server serves the same log; it has no /jwks.json, so the set is given.
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(httpx.get(f"{gateway.public_url}/jwks.json", timeout=60).content)
    assert audited(audit(gateway, "--jwks", str(jwks), url=gateway.agent_url))["audited"] == 8
    # Without --jwks the audit of the Agent server says so, on one line, and remembers nothing.
    untold = tmp_path / "untold-state.json"
    line = one_error_line(audit(gateway, "--state", str(untold), url=gateway.agent_url))
    assert f"{gateway.agent_url}/jwks.json: it answered 404" in line and "give --jwks" in line
    assert not untold.exists()
    # Without the Token the Public server answers 401: one line, exit 1.
    line = one_error_line(audit(gateway))
    assert "checkpoint" in line and "401" in line


def test_a_rewritten_or_withheld_decision_is_named(served_gateway: ServedGateway, tmp_path: Path) -> None:
    gateway = served_gateway
    token = token_of_a_user(gateway)
    state = tmp_path / "audit-state.json"
    published = publish(gateway, 8)
    audited(audit(gateway, "--state", str(state), token=token))
    url = gateway.env["AGENT_GATEWAY_DATABASE_URL"]

    # A Statement changed in the database: its JWS no longer matches the record.
    run_sql(url, f"UPDATE decisions SET statement = '\"forged\"' WHERE seq = {published[6]['seq']}")
    line = one_error_line(audit(gateway, token=token))
    assert f"Decision {published[6]['seq']}:" in line and "not what its JWS signs" in line
    run_sql(url, f"UPDATE decisions SET statement = '\"decided 6\"' WHERE seq = {published[6]['seq']}")
    audited(audit(gateway, token=token))

    # Rewritten by someone holding the key: the JWS verifies, the tree does not hold it.
    identity = SigningIdentity((gateway.directory / "signing-key.pem").read_bytes())
    seq, created_at = published[2]["seq"], published[2]["createdAt"]
    payload = orjson.dumps({"seq": seq, "createdAt": created_at, "statement": "rewritten"})
    forged = identity.sign(payload, DECISION_TYP)
    original = published[2]["jws"]
    run_sql(url, f"UPDATE decisions SET statement = '\"rewritten\"', jws = '{forged}' WHERE seq = {seq}")
    line = one_error_line(audit(gateway, token=token))
    assert f"Decision {seq} is not leaf 2 of checkpoint 8" in line
    run_sql(url, f"UPDATE decisions SET statement = '\"decided 2\"', jws = '{original}' WHERE seq = {seq}")

    # A Decision withheld (its row deleted): the log no longer rebuilds the checkpoint.
    run_sql(url, f"DELETE FROM decisions WHERE seq = {published[4]['seq']}")
    line = one_error_line(audit(gateway, token=token))
    assert "checkpoint 8" in line and ("lacks" in line or f"Decision {published[5]['seq']}" in line)


def test_a_rewritten_tree_or_another_key_fails_the_checkpoint(served_gateway: ServedGateway, tmp_path: Path) -> None:
    gateway = served_gateway
    token = token_of_a_user(gateway)
    state = tmp_path / "audit-state.json"
    publish(gateway, 8)
    audited(audit(gateway, "--state", str(state), token=token))
    # Another key's JWK Set: the checkpoint's signature is not the one expected.
    other = tmp_path / "other-jwks.json"
    other.write_bytes(orjson.dumps(SigningIdentity(keys.generate_pem("ed25519")).jwks()))
    line = one_error_line(audit(gateway, "--jwks", str(other), token=token))
    assert "checkpoint does not verify" in line
    # The root of the first 8 leaves rewritten in the database: the next checkpoint (signed over
    # it) cannot be proved consistent with the remembered one.
    url = gateway.env["AGENT_GATEWAY_DATABASE_URL"]
    node = key((3, 0))
    if url.startswith("sqlite"):
        run_sql(url, f"UPDATE decision_tree SET hash = X'{'00' * 32}' WHERE node = {node}")
    else:
        run_sql(url, f"UPDATE decision_tree SET hash = '\\x{'00' * 32}'::bytea WHERE node = {node}")
    publish(gateway, 1)
    line = one_error_line(audit(gateway, "--state", str(state), token=token))
    assert "checkpoint 9 is not consistent with remembered checkpoint 8" in line
