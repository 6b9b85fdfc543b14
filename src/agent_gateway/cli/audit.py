"""``agent-gateway audit``: verify the Decision log (or with --ledger the Run ledger) as a third party, over HTTP only."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Annotated

import httpx
import typer

from agent_gateway import jsontext
from agent_gateway.cli import proofs
from agent_gateway.cli.common import fail, print_json
from agent_gateway.ledger import audit as ledger_audit
from agent_gateway.signatures import verifier
from agent_gateway.transparency import audit as audits


def audit(
    url: Annotated[str, typer.Argument(help="the gateway: its Public server (with --token-stdin) or its Agent server")],
    state: Annotated[
        Path | None, typer.Option("--state", help="remembers the last verified checkpoint between runs")
    ] = None,
    jwks: Annotated[
        str | None, typer.Option("--jwks", help="the JWK Set: a file or URL (default: URL/jwks.json)")
    ] = None,
    token_stdin: Annotated[bool, typer.Option("--token-stdin", help="read a bearer Token from stdin")] = False,
    witnesses: Annotated[
        list[str] | None,
        typer.Option("--witness", help="a witness's cosignature vkey: the witnessed checkpoint is required too; repeat for each"),
    ] = None,
    quorum: Annotated[
        int | None, typer.Option("--quorum", min=1, help="cosignatures needed among --witness (default: all of them)")
    ] = None,
    ledger: Annotated[
        bool, typer.Option("--ledger", help="audit the Run ledger instead, and sum up what its new entries say")
    ] = False,
) -> None:
    """Verify the signed checkpoint, its consistency with the remembered one, and every new Decision.

    Exit 0 when everything holds (and remember the checkpoint); exit 1 with one
    line naming the first Decision or checkpoint that does not. With --witness, the
    witnessed checkpoint must also verify, hold --quorum cosignatures of those
    witnesses, and be consistent with the checkpoint verified. A witness's key given twice is
    refused; a --quorum of half the witnesses or fewer is warned about on stderr (two parties
    counting that few may count disjoint witnesses, and each be shown its own fork).
    With --ledger, the Run ledger is audited the same way, witnesses too (give it a --state file
    of its own), its entries numbered from 1 without gaps and each Run naming an instructions
    entry before it, and the summary lists the instruction changes, the Runs per Signal kind, and
    the Runs of Signals the operator emitted directly (whatever their kind).
    """
    witness_keys, needed = proofs.witness_policy(witnesses, quorum)
    base = url.rstrip("/")
    headers = {}
    if token_stdin:
        token = typer.get_text_stream("stdin").read().strip()
        if not token:
            raise fail("--token-stdin: no Token on stdin")
        headers["Authorization"] = f"Bearer {token}"
    try:
        keys = verifier.load_jwk_set(jwks or f"{base}/jwks.json")
    except verifier.JwkSetError as exc:
        # The likely cause: URL is the Agent server, which serves no JWK Set.
        hint = "" if jwks else " (an Agent server has none: give --jwks FILE_OR_URL, e.g. the Public server's /jwks.json)"
        raise fail(f"{exc}{hint}") from None
    try:
        remembered = audits.load_state(state.read_bytes() if state is not None and state.exists() else None)
        with httpx.Client(base_url=base, headers=headers, timeout=audits.TIMEOUT_S) as client:
            kind = ledger_audit.LedgerAuditor if ledger else audits.Auditor
            auditor = kind(client, keys, witness_keys, needed)
            new_state, report = auditor.audit(remembered)
    except audits.AuditFailure as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"--state {state}: {exc.strerror}") from None
    if state is not None:
        _write(state, jsontext.dumps(new_state.to_json(), indent=True))
    checkpoint = report.checkpoint
    print_json(
        {
            "origin": checkpoint.origin,
            "treeSize": checkpoint.size,
            "rootHash": base64.b64encode(checkpoint.root).decode(),
            "audited": report.decisions,
            **(auditor.summary.to_json() if isinstance(auditor, ledger_audit.LedgerAuditor) else {}),
        }
    )


def _write(path: Path, content: bytes) -> None:
    """Replace ``path`` whole: a run stopped half-way leaves the old state."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_bytes(content)
        os.replace(temporary, path)
    except OSError as exc:
        raise fail(f"--state {path}: cannot write: {exc.strerror}") from None
