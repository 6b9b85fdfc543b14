"""GET /decisions/{seq}/proof?format=tlog-proof (c2sp.org/tlog-proof@v1) on both servers,
``agent-gateway verify-proof`` and ``audit --witness``: accepted when every check holds, refused in one line naming the check
when one byte of the leaf, a proof hash or a cosignature changes, under a wrong key, below the quorum,
or for another statement. Cosignatures are made by hand here (tests/transparency/test_witnessed.py);
tests/transparency/test_collector.py checks a real witness's proof with aics-tlog too."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from typer.testing import CliRunner

from agent_gateway.cli.main import app
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys, verifier
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.transparency import audit as audits
from agent_gateway.transparency import note, proof, service, witness
from tests.transparency.test_routes import assert_error, publish
from tests.transparency.test_witnessed import NAMES, VKEYS, current_text, settings, store_cosignature  # noqa: F401
from tests.transparency.test_witness import cosign

pytestmark = pytest.mark.processes

from tests.signatures.conftest import bearer  # noqa: E402,F401


def gateway_vkey(gateway: Gateway) -> str:
    return service.signer(gateway.settings, gateway.identity).key.vkey()


def verify_proof(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["verify-proof", str(path), *args])
    output = (result.stdout + (result.stderr or "")).strip()
    assert "\n" not in output and "Traceback" not in output, output
    return result.exit_code, output


async def witnessed_proof(agent: httpx.AsyncClient, gateway: Gateway) -> tuple[bytes, list[dict]]:
    published = await publish(agent, 3)
    three = await current_text(agent)
    await store_cosignature(gateway, 0, three)
    await store_cosignature(gateway, 1, three)
    response = await agent.get(f"/decisions/{published[1]['seq']}/proof?format=tlog-proof")
    assert response.status_code == 200 and response.headers["content-type"] == "text/plain; charset=utf-8"
    return response.content, published


async def test_the_proof_is_a_tlog_proof_of_the_decisions_jws_in_the_witnessed_checkpoint(
    agent: httpx.AsyncClient, public: httpx.AsyncClient, gateway: Gateway, bearer: dict[str, str]
) -> None:
    data, published = await witnessed_proof(agent, gateway)
    assert data.startswith(b"c2sp.org/tlog-proof@v1\nextra " + base64.b64encode(published[1]["jws"].encode()) + b"\nindex 1\n")
    parsed = proof.TlogProof.parse(data)
    assert parsed.render() == data
    assert parsed.note == (await agent.get("/checkpoint/witnessed")).content
    verified = proof.verify(parsed, proof.gateway_key(gateway_vkey(gateway)), [witness.WitnessKey.parse(v) for v in VKEYS], 2, "d1")
    assert (verified.seq, verified.statement, verified.checkpoint.size) == (published[1]["seq"], "d1", 3)
    assert verified.cosigned_by == NAMES[:2]
    # The Public server answers the same behind the bearer.
    path = f"/decisions/{published[1]['seq']}/proof?format=tlog-proof"
    await assert_error(await public.get(path), 401)
    assert (await public.get(path, headers=bearer)).content == data


async def test_no_proof_before_a_witnessed_checkpoint_holds_the_decision(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    first = (await publish(agent, 1))[0]
    await assert_error(await agent.get(f"/decisions/{first['seq']}/proof?format=tlog-proof"), 404)
    one = await current_text(agent)
    await store_cosignature(gateway, 0, one)
    await store_cosignature(gateway, 1, one)
    second = (await publish(agent, 1))[0]
    assert (await agent.get(f"/decisions/{first['seq']}/proof?format=tlog-proof")).status_code == 200
    await assert_error(await agent.get(f"/decisions/{second['seq']}/proof?format=tlog-proof"), 404)
    await assert_error(await agent.get("/decisions/99/proof?format=tlog-proof"), 404)
    await assert_error(await agent.get(f"/decisions/{first['seq']}/proof?format=json"), 400)
    await assert_error(await agent.get(f"/decisions/{first['seq']}/proof?format=tlog-proof&size=1"), 400)


def flip(data: bytes, at: int) -> bytes:
    changed = bytearray(data)
    changed[at] ^= 1
    return bytes(changed)


async def test_verify_proof_accepts_and_refuses_in_one_line(agent: httpx.AsyncClient, gateway: Gateway, tmp_path: Path) -> None:
    data, published = await witnessed_proof(agent, gateway)
    good = tmp_path / "good.tlog-proof"
    good.write_bytes(data)
    key = gateway_vkey(gateway)
    witnesses = [arg for vkey in VKEYS[:2] for arg in ("--witness", vkey)]
    code, said = verify_proof(good, "--key", key, *witnesses, "--statement", "d1")
    assert code == 0 and said.startswith(f"ok: Decision {published[1]['seq']} is in ") and "w1.example/w, w2.example/w" in said
    assert verify_proof(good, "--key", key)[0] == 0  # no witnesses asked for: the log's own proof

    parsed = proof.TlogProof.parse(data)
    leaf = proof.TlogProof(flip(parsed.extra, 40), parsed.index, parsed.hashes, parsed.note)
    hashed = proof.TlogProof(parsed.extra, parsed.index, [flip(parsed.hashes[0], 3), *parsed.hashes[1:]], parsed.note)
    w1_line = parsed.note.split(b"\n\n", 1)[1].split(b"\n")[1]
    blob = bytearray(base64.b64decode(w1_line.split(b" ")[2]))
    blob[30] ^= 1
    bad_line = b" ".join(w1_line.split(b" ")[:2] + [base64.b64encode(bytes(blob))])
    cosignature = proof.TlogProof(parsed.extra, parsed.index, parsed.hashes, parsed.note.replace(w1_line, bad_line))
    other_key = service.signer(gateway.settings, SigningIdentity(keys.generate_pem("ed25519"))).key.vkey()
    cases = [
        (leaf.render(), ["--key", key], "inclusion:"),
        (hashed.render(), ["--key", key], "inclusion:"),
        (cosignature.render(), ["--key", key, *witnesses], "cosignatures: 1 of the given witnesses cosigned, --quorum is 2 (no valid cosignature by w1.example/w)"),
        (data, ["--key", other_key], "checkpoint: no signature by the gateway's key"),
        (data, ["--key", key, *witnesses, "--witness", VKEYS[2]], "cosignatures: 2 of the given witnesses cosigned, --quorum is 3 (no valid cosignature by w3.example/w)"),
        (data, ["--key", key, *witnesses, "--statement", "d2"], "statement:"),
        (data, ["--key", key, "--witness", VKEYS[0], "--quorum", "2"], "--quorum 2: more than the 1 --witness keys given"),
        (data, ["--key", "nope"], "--key: not an Ed25519"),
        (data, ["--key", key, "--witness", "nope"], "--witness #1:"),
        (b"not a proof\n", ["--key", key], "format:"),
        (data.replace(b"index 1", b"index 2"), ["--key", key], "inclusion:"),
    ]
    for index, (content, args, expected) in enumerate(cases):
        path = tmp_path / f"case{index}"
        path.write_bytes(content)
        code, said = verify_proof(path, *args)
        assert code == 1 and said.startswith("agent-gateway: error: ") and expected in said, (index, said)
    # A cosignature line of a witness nobody asked about is ignored; a quorum below the witnesses given holds.
    text = note.open_note(parsed.note, [proof.gateway_key(key)])
    stranger = tmp_path / "stranger"
    stranger.write_bytes(data + cosign(text, name="stranger.example/w", key=ed25519.Ed25519PrivateKey.generate()))
    assert verify_proof(stranger, "--key", key, *witnesses)[0] == 0
    assert verify_proof(good, "--key", key, *witnesses, "--witness", VKEYS[2], "--quorum", "2")[0] == 0
    missing = tmp_path / "missing"
    assert "missing" in verify_proof(missing, "--key", key)[1]


class _Bridge(httpx.BaseTransport):
    """A sync transport (the auditor's) onto the in-process Agent server, from a worker thread."""

    def __init__(self, app: object, loop: asyncio.AbstractEventLoop) -> None:
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")  # type: ignore[arg-type]
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            built = self._client.build_request(request.method, str(request.url), headers=request.headers, content=request.read())
            response = await self._client.send(built)
            return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())

        return asyncio.run_coroutine_threadsafe(send(), self._loop).result()


async def audit_round(gateway: Gateway, vkeys: list[str], quorum: int) -> audits.Report:
    transport = _Bridge(gateway.agent_asgi, asyncio.get_running_loop())
    jwks = verifier.parse_jwk_set(gateway.identity.jwks())
    keys_ = [witness.WitnessKey.parse(vkey) for vkey in vkeys]

    def run() -> audits.Report:
        with httpx.Client(transport=transport, base_url="http://agent") as client:
            return audits.Auditor(client, jwks, keys_, quorum).audit(audits.load_state(None))[1]

    return await asyncio.to_thread(run)


async def test_audit_with_witnesses_requires_the_witnessed_checkpoint_at_the_quorum(agent: httpx.AsyncClient, gateway: Gateway) -> None:
    await publish(agent, 2)
    with pytest.raises(audits.AuditFailure, match="the witnessed checkpoint: none yet"):
        await audit_round(gateway, VKEYS[:2], 2)
    two = await current_text(agent)
    await store_cosignature(gateway, 0, two)
    await store_cosignature(gateway, 1, two)
    assert (await audit_round(gateway, VKEYS[:2], 2)).checkpoint.size == 2
    with pytest.raises(audits.AuditFailure, match="witnessed checkpoint 2: 2 of the given witnesses cosigned it, --quorum is 3"):
        await audit_round(gateway, VKEYS, 3)
    # The log grows past the witnessed checkpoint: it must extend it, and it does.
    await publish(agent, 3)
    assert (await audit_round(gateway, VKEYS[:2], 2)).checkpoint.size == 5
    # Without --witness, nothing of the witnesses is asked.
    assert (await audit_round(gateway, [], 0)).checkpoint.size == 5
