"""``agent-gateway keys generate``, ``sign`` and the offline ``verify``, as real subprocesses."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import orjson
import pytest

from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity

from tests.cli.test_main import one_error_line
from tests.served import ServedGateway, run_cli, run_cli_here
from tests.signatures.helpers import independent_verify, segments

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deployment made by ``agent-gateway init``; its config names the key ``sign`` uses."""
    directory = tmp_path_factory.mktemp("deployment")
    result = run_cli("init", str(directory), config=directory / "gateway.toml")
    assert result.returncode == 0, result.stderr
    return directory / "gateway.toml"


@pytest.fixture(scope="module")
def jwks_file(deployment: Path) -> Path:
    path = deployment.parent / "jwks.json"
    path.write_bytes(orjson.dumps(SigningIdentity((deployment.parent / "signing-key.pem").read_bytes()).jwks()))
    return path


@pytest.mark.parametrize(("key_type", "algorithm"), [("ed25519", "EdDSA"), ("p256", "ES256"), ("p384", "ES384"), ("p521", "ES512")])
def test_keys_generate_writes_a_private_key_for_the_owner_only(tmp_path: Path, key_type: str, algorithm: str) -> None:
    out = tmp_path / "key.pem"
    result = run_cli_here("keys", "generate", "--type", key_type, str(out), config=tmp_path / "none.toml")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert SigningIdentity(out.read_bytes()).algorithm == algorithm


def test_keys_generate_defaults_to_ed25519_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "key.pem"
    assert run_cli("keys", "generate", str(out), config=tmp_path / "none.toml").returncode == 0
    before = out.read_bytes()
    assert SigningIdentity(before).algorithm == "EdDSA"
    again = run_cli_here("keys", "generate", str(out), config=tmp_path / "none.toml")
    assert again.returncode == 1 and "exists" in again.stderr
    assert out.read_bytes() == before
    bad_type = run_cli_here("keys", "generate", "--type", "rsa", str(tmp_path / "other.pem"), config=tmp_path / "none.toml")
    assert bad_type.returncode == 2 and not (tmp_path / "other.pem").exists()


def test_sign_signs_claims_in_the_order_written(deployment: Path, jwks_file: Path) -> None:
    claims = '{"z": 1, "statement": "we ship", "a": {"nested": [true, null]}}'
    result = run_cli("sign", claims, config=deployment)
    assert result.returncode == 0, result.stderr
    jws = orjson.loads(result.stdout)["jws"]
    header, payload, _ = segments(jws)
    assert orjson.loads(header) == {"alg": "EdDSA", "typ": "service-statement+jws"}
    assert payload == b'{"z":1,"statement":"we ship","a":{"nested":[true,null]}}'
    (jwk,) = orjson.loads(jwks_file.read_bytes())["keys"]
    independent_verify(jws, jwk)


def test_sign_reads_claims_from_stdin_and_takes_a_typ(deployment: Path) -> None:
    result = run_cli_here("sign", "-", "--typ", "memo+jws", config=deployment, input='{"statement": "from stdin"}')
    assert result.returncode == 0, result.stderr
    header, payload, _ = segments(orjson.loads(result.stdout)["jws"])
    assert orjson.loads(header)["typ"] == "memo+jws" and payload == b'{"statement":"from stdin"}'


def test_sign_refuses_bad_claims_with_one_line(deployment: Path) -> None:
    # Every refusal is covered in test_service.py; here, how the command reports one.
    result = run_cli("sign", '{"other": 1}', config=deployment)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["agent-gateway: error: claims must include statement, a non-empty string"]
    assert run_cli_here("sign", "not json", config=deployment).returncode == 1


def test_sign_needs_a_signing_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[auth]\ntoken_ttl_ms = 1000\n")
    result = run_cli("sign", '{"statement": "s"}', config=config)
    assert result.returncode == 1 and "signing.key_file: required" in result.stderr


def test_verify_checks_an_artifact_against_a_jwk_set_file(deployment: Path, jwks_file: Path, tmp_path: Path) -> None:
    jws = orjson.loads(run_cli_here("sign", '{"statement": "s", "n": 1}', config=deployment).stdout)["jws"]
    nowhere = tmp_path / "no-config.toml"  # the verifier needs no configuration and no database
    result = run_cli("verify", jws, "--jwks", str(jwks_file), config=nowhere)
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout) == {
        "verified": True,
        "header": {"alg": "EdDSA", "typ": "service-statement+jws"},
        "payload": {"statement": "s", "n": 1},
    }
    from_stdin = run_cli_here("verify", "-", "--jwks", str(jwks_file), config=nowhere, input=jws + "\n")
    assert from_stdin.returncode == 0 and orjson.loads(from_stdin.stdout)["verified"] is True
    tampered = jws[: jws.index(".") + 1] + "e30" + jws[jws.rindex(".") :]
    refused = run_cli_here("verify", tampered, "--jwks", str(jwks_file), config=nowhere)
    assert refused.returncode == 1 and orjson.loads(refused.stdout) == {"verified": False}
    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps(SigningIdentity(keys.generate_pem("ed25519")).jwks()))
    assert orjson.loads(run_cli_here("verify", jws, "--jwks", str(other), config=nowhere).stdout) == {"verified": False}


def test_verify_explains_an_unusable_jwk_set(tmp_path: Path) -> None:
    # Every kind of unusable set is covered in test_verifier.py; here, how the command reports one.
    path = tmp_path / "jwks.json"
    path.write_bytes(b'{"keys": []}')
    result = run_cli("verify", "a.b.c", "--jwks", str(path), config=tmp_path / "none.toml")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["agent-gateway: error: the JWK Set holds no public signature key"]


@pytest.mark.e2e
def test_a_served_gateway_s_artifacts_verify_offline_against_its_jwks_url(served_gateway: ServedGateway, tmp_path: Path) -> None:
    statement = httpx.post(f"{served_gateway.agent_url}/sign", json={"statement": "s"}).json()["jws"]
    decision = httpx.post(f"{served_gateway.agent_url}/decisions", json={"statement": "d"}).json()
    jwks_url = f"{served_gateway.public_url}/jwks.json"
    nowhere = tmp_path / "no-config.toml"
    # The command's real start once; its repeats in this process.
    for run, jws, payload in (
        (run_cli, statement, {"statement": "s"}),
        (run_cli_here, decision["jws"], {"seq": 1, "createdAt": decision["createdAt"], "statement": "d"}),
    ):
        result = run("verify", jws, "--jwks", jwks_url, config=nowhere)
        assert result.returncode == 0, result.stderr
        assert orjson.loads(result.stdout)["payload"] == payload
    unreachable = one_error_line(run_cli_here("verify", statement, "--jwks", "http://127.0.0.1:9/jwks.json", config=nowhere))
    assert unreachable.startswith("agent-gateway: error: cannot fetch http://127.0.0.1:9/jwks.json: ")
    # A URL that answers with an error: its status, on one line (not httpx's two).
    missing = f"{served_gateway.agent_url}/jwks.json"
    assert one_error_line(run_cli_here("verify", statement, "--jwks", missing, config=nowhere)) == (
        f"agent-gateway: error: cannot fetch {missing}: it answered 404"
    )


@pytest.mark.e2e
def test_serve_refuses_to_start_without_a_signing_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[auth]\ntoken_ttl_ms = 1000\n[database]\nurl = "sqlite:///gateway.db"\n')
    result = run_cli("serve", config=config)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("agent-gateway: error: signing.key_file: required")
    config.write_text('[auth]\ntoken_ttl_ms = 1000\n[signing]\nkey_file = "missing.pem"\n')
    result = run_cli("serve", config=config)
    assert result.returncode == 1 and "cannot read" in result.stderr


@pytest.mark.e2e
def test_serve_takes_the_key_from_the_environment(tmp_path: Path) -> None:
    pem = keys.generate_pem("p384")
    directory = tmp_path / "deployment"
    with ServedGateway.start(directory, f"sqlite:///{tmp_path / 'gateway.db'}", env={"AGENT_GATEWAY_SIGNING_KEY": pem.decode()}) as gateway:
        assert httpx.get(f"{gateway.public_url}/jwks.json").json() == SigningIdentity(pem).jwks()
