"""A User's receipt (issue 41): the proof that one of their inbound Messages reached the agent as
they wrote it, under published instructions, and its check with no network (docs: "What the
agent is told, on the record").

A receipt holds the Message as its Signal's payload holds it, without its text (the User has
the text; the receipt is theirs to show without showing it), the Signal's id, kind and
emission time, the ledger entries of the Runs the Signal caused and of the instructions they
ran under, each with its RFC 9162 inclusion proof, and the signed checkpoint of the ledger
those proofs lead to. A verifier puts the text back into the payload, renders the Prompt with
the template of the published instructions entry (the gateway's own renderer,
``signals.handlers.TemplateHandler``), and compares both digests with the Run's entry.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from datetime import timedelta
from typing import Any

import orjson
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import clock, errors, merkle
from agent_gateway.ledger import entries as leaves
from agent_gateway.ledger import service
from agent_gateway.messages.service import INBOUND, RECEIVED
from agent_gateway.signals.handlers import TemplateFailed, TemplateHandler
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import ledger as queries
from agent_gateway.store.queries import messages as message_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries.signals import Signal
from agent_gateway.transparency import note
from agent_gateway.transparency import service as transparency

# The payload member the receipt leaves out: the User's own words.
TEXT = "text"
# A Message's Signal is emitted in the transaction that records it, seconds at most after its
# createdAt: the search for one that retention removed stops this far after.
SIGNAL_WITHIN = timedelta(hours=1)


class EntryOut(BaseModel):
    """One ledger entry on the wire: ``GET /ledger/entries`` lists them, and a receipt's proved
    entries (:class:`ProvedEntry`) are these with their proof."""

    model_config = ConfigDict(strict=True, extra="forbid")

    seq: int = Field(description="the entry's number, from 1 without gaps")
    index: int = Field(description="its leaf's index in the ledger's Merkle tree: seq - 1")
    kind: str = Field(description="instructions or run")
    leaf: str = Field(description="the entry's leaf, exactly: its UTF-8 bytes are the RFC 8785 canonical JSON of the entry")


class ProvedEntry(EntryOut):
    treeSize: int = Field(description="the size of the tree the proof leads to: the checkpoint's")
    hashes: list[str] = Field(description="the RFC 9162 inclusion proof of the leaf in that tree, base64")


def entry_out(entry: queries.Entry) -> dict[str, Any]:
    """``entry`` as :class:`EntryOut` has it."""
    return {"seq": entry.seq, "index": entry.seq - 1, "kind": entry.kind, "leaf": entry.leaf.decode()}


async def proved(store: Store, entry: queries.Entry, size: int | None) -> dict[str, Any]:
    """``entry`` with its inclusion proof in the tree of ``size`` entries (None: the current tree)."""
    proof = await transparency.inclusion(store, entry.seq, size, service.LOG)
    return {**entry_out(entry), "treeSize": proof.tree_size, "hashes": merkle.b64(proof.hashes)}


class SignalRef(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    id: str
    kind: str
    emittedAt: str


class Receipt(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    message: dict[str, Any] = Field(description="the Message as its Signal's payload holds it, without its text")
    signal: SignalRef = Field(description="the Signal the Message emitted (the Prompt's template may name these)")
    checkpoint: str = Field(description="the Run ledger's checkpoint, a C2SP signed note, the proofs' tree head")
    runs: list[ProvedEntry] = Field(description="the entries of the Runs the Signal caused; none until one started")
    instructions: list[ProvedEntry] = Field(description="the instructions entries those Runs ran under")


class ReceiptNotFound(errors.NotFound):
    """No Message of yours has this seq."""


class NoReceipt(errors.NotFound):
    """This Message has no receipt: only an inbound Message (yours to the agent) has one."""


async def build(store: Store, checkpoints: transparency.Checkpoints, user_id: str, seq: int) -> dict[str, Any]:
    """The receipt of Message ``seq`` of ``user_id``'s log. Raises :class:`ReceiptNotFound` for a
    number of no Message of theirs (another User's answers the same), :class:`NoReceipt` for an
    outbound Message or one whose Signal retention removed."""
    message = await message_queries.get(store, user_id=user_id, seq=seq)
    if message is None:
        raise ReceiptNotFound()
    if message.direction != INBOUND:
        raise NoReceipt(f"Message {seq} is the agent's (outbound): only your inbound Messages have a receipt")
    since = clock.parse_instant(message.created_at)
    signal = await signal_queries.carrying(
        store, kind=RECEIVED, since=message.created_at, until=clock.format_instant(since + SIGNAL_WITHIN),
        payload_id=message.id,
    )
    if signal is None or not isinstance(signal.payload, dict) or signal.payload.get("userId") != user_id:
        raise NoReceipt(f"Message {seq}'s Signal was pruned (signals.retention): its receipt can no longer be made")
    runs = await queries.of_signal(store, signal_id=signal.id)
    told = sorted({orjson.loads(entry.leaf)["instructions"] for entry in runs})
    # Read after the entries: its tree holds them all, and every proof leads to it.
    signed = await checkpoints.latest()
    size = note.Checkpoint.parse(signed[: signed.index(b"\n\n") + 1]).size
    return {
        "message": {name: value for name, value in signal.payload.items() if name != TEXT},
        "signal": {"id": signal.id, "kind": signal.kind, "emittedAt": signal.emitted_at},
        "checkpoint": signed.decode(),
        "runs": [await proved(store, entry, size) for entry in runs],
        "instructions": [await proved(store, await service.get(store, number), size) for number in told],
    }


# --- Checking a receipt, offline -------------------------------------------------------


class ReceiptFailure(errors.GatewayError):
    """The receipt does not prove that this text reached the agent; the message names what differs."""


@dataclasses.dataclass(frozen=True)
class Verified:
    seq: int  # the Message's
    user: str  # the id of the User whose Message it is
    instructions: list[int]  # the numbers of the instructions entries its Runs ran under
    runs: int
    checkpoint: note.Checkpoint


def parse(data: bytes) -> Receipt:
    """The receipt in ``data`` (JSON as ``GET /messages/{seq}/receipt`` answers it). Raises :class:`ReceiptFailure`."""
    try:
        return Receipt.model_validate_json(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise ReceiptFailure(f"format: not a receipt ({where}: {first['msg']})") from None


def verify(receipt: Receipt, text: str, key: note.NoteKey, *, user: str | None = None, seq: int | None = None) -> Verified:
    """Check ``receipt`` for the Message ``text``: given ``user`` and ``seq``, that it is of that
    User's Message of that number (the receipt's own Message is bound to the Run by its payload
    digest, so a receipt of another User's Message with the same text would verify otherwise); the
    checkpoint's signature by ``key`` (the gateway's, under the Run ledger's origin), every entry's
    inclusion in it, and for each Run the payload and Prompt digests of its entry against the payload
    rebuilt with ``text`` and the Prompt rendered from its instructions' template, which precede it.
    Raises :class:`ReceiptFailure`."""
    whose, number = receipt.message.get("userId"), receipt.message.get("seq")
    if user is not None and whose != user:
        raise ReceiptFailure(f"message: the receipt is of User {whose}'s Message, not --user {user}'s")
    if seq is not None and number != seq:
        raise ReceiptFailure(f"message: the receipt is of Message {number}, not --seq {seq}")
    checkpoint = _checkpoint(receipt.checkpoint.encode(), key)
    runs = [_included(entry, checkpoint, leaves.RUN) for entry in receipt.runs]
    told = {entry.seq: _included(entry, checkpoint, leaves.INSTRUCTIONS) for entry in receipt.instructions}
    if not runs:
        raise ReceiptFailure(f"no Run: Message {number} has not reached the agent yet (the receipt holds no Run entry)")
    payload = {**receipt.message, TEXT: text}
    signal = Signal(receipt.signal.id, receipt.signal.kind, payload, receipt.signal.emittedAt, "processing", None)
    for run in runs:
        _check_run(run, signal, told)
    instructions = sorted({run["instructions"] for run in runs})
    return Verified(number, str(whose), instructions, len(runs), checkpoint)  # type: ignore[arg-type]


def ledger_origins(name: str) -> set[str]:
    """The Run ledger's origins for the key named ``name``: the Decision log's vkey (``keys show``'s
    ``vkey``) names the Decision log, whose ledger's origin is derived from it; the ledger's own vkey
    (``ledger.vkey``) names the ledger itself, by the prefix or suffix every ledger origin has."""
    derived = transparency.ledger_origins(name)
    if name.startswith(transparency.LEDGER_ORIGIN_PREFIX) or name.endswith("/ledger"):
        derived.add(name)
    return derived


def _checkpoint(signed: bytes, key: note.NoteKey) -> note.Checkpoint:
    origin = signed.split(b"\n", 1)[0].decode(errors="replace")
    if origin not in ledger_origins(key.name):
        # A note of the Decision log (or any other) under the same key: not the tree the ledger's
        # witnesses and auditors see, so it proves nothing of the ledger.
        shown = origin if len(origin) <= 80 else origin[:80] + "…"
        raise ReceiptFailure(f"checkpoint: the note is another log's ({shown!r}), not the Run ledger's of --key {key.name}")
    ledger_key = dataclasses.replace(key, name=origin)
    try:
        return note.Checkpoint.parse(note.open_note(signed, [ledger_key]))
    except note.NoteError as exc:
        raise ReceiptFailure(f"checkpoint: {exc} (--key {key.name})") from None


def _included(entry: ProvedEntry, checkpoint: note.Checkpoint, kind: str) -> dict[str, Any]:
    """The entry's content once its leaf is proved in ``checkpoint``'s tree and is a ``kind`` entry."""
    where = f"entry {entry.seq}"
    data = entry.leaf.encode()
    try:
        hashes = [base64.b64decode(hash_, validate=True) for hash_ in entry.hashes]
    except binascii.Error:
        raise ReceiptFailure(f"inclusion: {where}: a proof hash is not base64") from None
    if entry.index != entry.seq - 1:
        raise ReceiptFailure(f"inclusion: {where} is leaf {entry.seq - 1}, not {entry.index}")
    try:
        merkle.verify_inclusion(entry.index, checkpoint.size, merkle.leaf_hash(data), hashes, checkpoint.root)
    except merkle.ProofError as exc:
        raise ReceiptFailure(f"inclusion: {where} is not in the checkpoint's tree ({exc})") from None
    try:
        content = orjson.loads(data)
        canonical = leaves.canonical(content) == data
    except (orjson.JSONDecodeError, ValueError):
        canonical = False
    if not canonical or not isinstance(content, dict) or content.get("type") != kind:
        raise ReceiptFailure(f"format: {where} is not the canonical JSON of a {kind} entry")
    content["seq"] = entry.seq
    return content


def _check_run(run: dict[str, Any], signal: Signal, told: dict[int, dict[str, Any]]) -> None:
    where = f"Run {run.get('run')} (entry {run['seq']})"
    if run.get("signal") != signal.id or run.get("kind") != signal.kind:
        raise ReceiptFailure(f"signal: {where} is the Run of another Signal than the receipt's")
    number = run.get("instructions")
    instructions = told.get(number) if isinstance(number, int) else None
    if instructions is None:
        raise ReceiptFailure(f"instructions: {where} ran under instructions #{number}, which the receipt does not hold")
    if number >= run["seq"]:  # type: ignore[operator]
        # The gateway appends the instructions before the Runs they are in force for: a later entry
        # was published after the Prompt was made, and says nothing of how it was made.
        raise ReceiptFailure(f"instructions: {where} names instructions #{number}, appended after it: not what it ran under")
    if not isinstance(run.get("payload"), str):
        raise ReceiptFailure(f"text: {where} records no payload digest: nothing ties a text to it")
    try:
        digest = leaves.sha256(leaves.canonical(signal.payload))
    except ValueError:
        # Every Message's payload is JSON the gateway hashed; this one (the receipt's with the text) is not.
        seq = signal.payload.get("seq")
        raise ReceiptFailure(f"text: Message {seq} with this text is no payload the gateway could have hashed (RFC 8785)") from None
    if digest != run.get("payload"):
        raise ReceiptFailure(
            f"text: Message {signal.payload.get('seq')} as the agent was given it is not this text "
            f"(or not this Message): the payload digest of {where} differs"
        )
    handler = _handler(instructions, signal.kind, number)  # type: ignore[arg-type]
    try:
        [prompt] = handler.handle(signal)
    except TemplateFailed as exc:
        raise ReceiptFailure(f"prompt: instructions #{number}: {exc}") from None
    session = f"run_{run.get('run')}" if prompt.session is None else prompt.session
    if leaves.sha256(prompt.text.encode()) != run.get("prompt") or session != run.get("session"):
        raise ReceiptFailure(
            f"prompt: the template of instructions #{number} does not make the Prompt {where} was given "
            "(the instructions differ from those the Prompt was made with)"
        )


def _handler(instructions: dict[str, Any], kind: str, number: int) -> TemplateHandler:
    """The Handler of ``kind`` in instructions entry ``number``, rebuilt from its published template."""
    told = instructions.get("instructions")
    handlers = told.get("handlers") if isinstance(told, dict) else None
    found = [handler for handler in handlers or () if isinstance(handler, dict) and handler.get("kind") == kind]
    if not found:
        raise ReceiptFailure(f"prompt: instructions #{number} have no Handler of {kind}")
    [handler] = found[:1]
    template, session = handler.get("template"), handler.get("session")
    if not isinstance(template, str) or not isinstance(session, str | None):
        raise ReceiptFailure(
            f"prompt: the Handler of {kind} in instructions #{number} is Python code: its Prompt cannot be recomputed offline"
        )
    try:
        return TemplateHandler(kind, template, session)
    except Exception as exc:  # not the gateway's, which compiled it: any text may come, and Jinja2
        # raises more than its syntax error on some (a RecursionError for one nested past Python's limit)
        raise ReceiptFailure(f"prompt: the template of {kind} in instructions #{number} does not compile ({type(exc).__name__})") from None
