"""``agent-gateway verify-proof`` and ``verify-receipt``: check an offline proof of a Decision, or a
User's receipt of a Message, with no network and no database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent_gateway.cli.common import checked_uuid, fail
from agent_gateway.transparency import note, proof, witness


def witness_policy(vkeys: list[str] | None, quorum: int | None) -> tuple[list[witness.WitnessKey], int]:
    """The ``--witness`` keys and the ``--quorum`` (default: all of them); one line, exit 1, when not usable.

    A key given twice is refused, by its public key: cosignature/v1 signs the checkpoint and not the
    witness's name, so the same key under two names would count one cosignature twice. A quorum of
    half the witnesses or fewer is warned about (one line on stderr): two verifiers each counting
    that many may count disjoint witnesses, and so each accept its own fork of the log."""
    keys: list[witness.WitnessKey] = []
    for index, vkey in enumerate(vkeys or []):
        try:
            key = witness.WitnessKey.parse(vkey)
        except note.NoteError as exc:
            raise fail(f"--witness #{index + 1}: {exc}") from None
        same = [number for number, earlier in enumerate(keys, start=1) if earlier.public == key.public]
        if same:
            raise fail(f"--witness #{index + 1}: the same witness key as --witness #{same[0]} (list each witness once)")
        keys.append(key)
    needed = len(keys) if quorum is None else quorum
    if needed > len(keys):
        raise fail(f"--quorum {needed}: more than the {len(keys)} --witness keys given")
    if keys and 2 * needed <= len(keys):
        typer.echo(
            f"agent-gateway: warning: --quorum {needed} of {len(keys)} witnesses: two verifiers could each be shown "
            f"their own log, cosigned by witnesses the other did not count; ask for more than half ({len(keys) // 2 + 1})",
            err=True,
        )
    return keys, needed


def verify_proof(
    file: Annotated[Path, typer.Argument(help="the proof (c2sp.org/tlog-proof@v1), from GET /decisions/{seq}/proof?format=tlog-proof")],
    key: Annotated[str, typer.Option("--key", help="the gateway's vkey (agent-gateway keys show)")],
    witnesses: Annotated[
        list[str] | None, typer.Option("--witness", help="a witness's cosignature vkey; repeat for each")
    ] = None,
    quorum: Annotated[
        int | None, typer.Option("--quorum", min=0, help="cosignatures needed among --witness (default: all of them)")
    ] = None,
    statement: Annotated[str | None, typer.Option("--statement", help="the text the Decision must say")] = None,
) -> None:
    """Verify the proof: the leaf hashes into the checkpoint's root, the gateway's signature and the
    Decision's JWS verify under --key, at least --quorum of the --witness keys cosigned, and (with
    --statement) the Decision says that. Exit 0 and one line; exit 1 and one line naming the failure.
    A witness's key given twice is refused; a --quorum of half the witnesses or fewer is warned
    about on stderr (two parties counting that few may count disjoint witnesses).
    """
    witness_keys, needed = witness_policy(witnesses, quorum)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise fail(f"{file}: {exc.strerror}") from None
    try:
        verified = proof.verify(proof.TlogProof.parse(data), proof.gateway_key(key), witness_keys, needed, statement)
    except proof.ProofFailure as exc:
        raise fail(str(exc)) from None
    cosigned = f", cosigned by {', '.join(verified.cosigned_by)}" if verified.cosigned_by else ""
    typer.echo(f"ok: Decision {verified.seq} is in {verified.checkpoint.origin} at tree size {verified.checkpoint.size}{cosigned}")


def verify_receipt(
    file: Annotated[Path, typer.Argument(help="the receipt (JSON), from GET /messages/{seq}/receipt")],
    text: Annotated[str, typer.Option("--text", help="the Message as you wrote it")],
    key: Annotated[str, typer.Option("--key", help="the gateway's vkey (agent-gateway keys show)")],
    user: Annotated[
        str | None, typer.Option("--user", help="your User id (GET /users/me): refuse a receipt of another User's Message")
    ] = None,
    seq: Annotated[
        int | None, typer.Option("--seq", min=1, help="the Message's number in your log: refuse a receipt of another")
    ] = None,
) -> None:
    """Verify a receipt of a Message: the Run ledger's checkpoint is signed under --key, every
    entry is in its tree, and each Run's payload and Prompt digests are those of --text in the
    Message, its Prompt made with the template of the published instructions. The line names the
    Message and its User: give --user (and --seq) so that a receipt of another is refused. Exit 0
    and one line; exit 1 and one line naming what differs.
    """
    # The receipt's pydantic models and what they check with: built by this command only (a third
    # of every other command's start when imported with the command line).
    from agent_gateway.ledger import receipt

    user_id = checked_uuid("--user", user) if user is not None else None
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise fail(f"{file}: {exc.strerror}") from None
    try:
        parsed = receipt.parse(data)
        verified = receipt.verify(parsed, text, proof.gateway_key(key), user=user_id, seq=seq)
    except (receipt.ReceiptFailure, proof.ProofFailure) as exc:
        raise fail(_one_line(str(exc))) from None
    told = ", ".join(f"#{number}" for number in verified.instructions)
    said = f"your Message reached the agent as written, under instructions {told} (Message {verified.seq} of User {verified.user})"
    typer.echo(_one_line(said))


def _one_line(text: str) -> str:
    """``text`` on one line: a receipt's Message (its User id, its seq) and template errors are the file's words."""
    return " ".join(text.split())
