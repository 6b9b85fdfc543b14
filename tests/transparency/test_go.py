"""The gateway's checkpoints and proofs checked by another implementation: Go's
``golang.org/x/mod/sumdb/note`` and ``sumdb/tlog`` (Debian's golang-golang-x-mod-dev, built with
Debian's golang-go into a tiny program, tests/transparency/gocheck, once per session; no network).

Without Go or those sources these tests skip with the reason, unless
``AGENT_GATEWAY_TEST_REQUIRE_GO=1`` (set by ``.ci/run``, which installs both), where they fail.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.transparency import proof
from tests.transparency.test_proof import gateway_vkey, witnessed_proof
from tests.transparency.test_routes import publish
from tests.transparency.test_witnessed import VKEYS, current_text, settings  # noqa: F401

pytestmark = pytest.mark.processes

# The Public routes use the same stand-in authentication scheme as /verify.
from tests.signatures.conftest import bearer  # noqa: E402,F401

GOPATH = Path("/usr/share/gocode")
SOURCE = Path(__file__).resolve().parent / "gocheck" / "main.go"
# A ceiling for a broken build, not an expectation.
BUILD_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def gocheck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built gocheck program (GOPATH mode on Debian's sources: there is no module proxy here)."""
    go = shutil.which("go")
    if go is None or not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir():
        reason = "Go or golang.org/x/mod is missing (apt-get install golang-go golang-golang-x-mod-dev)"
        if os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_GO") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("gocheck")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOFLAGS": "", "GOPROXY": "off",
           "GOCACHE": str(directory / "cache")}
    built = subprocess.run([go, "build", "-o", str(directory / "gocheck"), str(SOURCE)],
                           env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stderr
    return directory / "gocheck"


def check(gocheck: Path, *args: str | Path) -> str | None:
    """None when Go accepts, else what it said."""
    done = subprocess.run([str(gocheck), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return None if done.returncode == 0 else done.stdout.strip() or "refused"


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def hashes_file(path: Path, hashes: list[bytes]) -> Path:
    return write(path, b"".join(base64.b64encode(hash_) + b"\n" for hash_ in hashes))


async def test_go_verifies_the_witnessed_note_its_signature_and_cosignatures(
    agent: httpx.AsyncClient, gateway: Gateway, gocheck: Path, tmp_path: Path
) -> None:
    data, _ = await witnessed_proof(agent, gateway)
    signed = write(tmp_path / "note", proof.TlogProof.parse(data).note)
    assert check(gocheck, "note", gateway_vkey(gateway), signed) is None
    assert check(gocheck, "cosignature", VKEYS[0], signed) is None
    assert check(gocheck, "cosignature", VKEYS[1], signed) is None
    # The third witness did not cosign; a byte of the text changed breaks every signature.
    assert check(gocheck, "cosignature", VKEYS[2], signed) is not None
    changed = write(tmp_path / "changed", flip(signed.read_bytes(), signed.read_bytes().index(b"\n") + 1))
    assert check(gocheck, "note", gateway_vkey(gateway), changed) is not None
    assert check(gocheck, "cosignature", VKEYS[0], changed) is not None


async def test_go_checks_the_inclusion_proof_of_a_tlog_proof(
    agent: httpx.AsyncClient, gateway: Gateway, gocheck: Path, tmp_path: Path
) -> None:
    data, _ = await witnessed_proof(agent, gateway)
    parsed = proof.TlogProof.parse(data)
    leaf, signed = write(tmp_path / "leaf", parsed.extra), write(tmp_path / "note", parsed.note)
    path = hashes_file(tmp_path / "proof", parsed.hashes)
    assert check(gocheck, "inclusion", leaf, parsed.index, signed, path) is None
    # Refused: one byte of the leaf, one bit of a proof hash, another index.
    assert check(gocheck, "inclusion", write(tmp_path / "other", flip(parsed.extra, 10)), parsed.index, signed, path) is not None
    bent = hashes_file(tmp_path / "bent", [flip(parsed.hashes[0], 0), *parsed.hashes[1:]])
    assert check(gocheck, "inclusion", leaf, parsed.index, signed, bent) is not None
    assert check(gocheck, "inclusion", leaf, parsed.index + 1, signed, path) is not None


async def test_go_checks_a_consistency_proof(agent: httpx.AsyncClient, gateway: Gateway, gocheck: Path, tmp_path: Path) -> None:
    await publish(agent, 3)
    old = write(tmp_path / "old", await current_text(agent))
    await publish(agent, 4)
    new = write(tmp_path / "new", await current_text(agent))
    response = await agent.get("/checkpoint/consistency?from=3&to=7")
    assert response.status_code == 200
    hashes = [base64.b64decode(hash_) for hash_ in response.json()["hashes"]]
    assert check(gocheck, "consistency", old, new, hashes_file(tmp_path / "proof", hashes)) is None
    bent = hashes_file(tmp_path / "bent", [*hashes[:-1], flip(hashes[-1], 31)])
    assert check(gocheck, "consistency", old, new, bent) is not None
