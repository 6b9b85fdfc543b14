"""Auditing the Run ledger from outside: what ``agent-gateway audit --ledger`` does, over HTTP only.

A round is the Decision log's (``transparency.audit``) on the ledger's routes: the signed
checkpoint, its consistency with the remembered one, every entry since, whose leaves must
rebuild the checkpoint's root, and with witnesses the ledger's witnessed checkpoint (a quorum of
them cosigned it, and it is consistent with the checkpoint: no fork shown to the witnesses). Each
leaf must be RFC 8785 canonical JSON of a known kind. Stricter than for Decisions, whose numbers may
skip: entries are numbered from 1 without gaps, entry ``seq`` is leaf ``seq - 1``, and each Run names
an instructions entry before it (the state remembers which entries are instructions, as a later
round's Runs may name an earlier round's). What the new entries say is summed up for a reader: each
change of the instructions with its time, the Runs per Signal kind, and every Run whose Signal the
operator emitted directly (its entry's ``origin`` is ``operator``, whatever its kind), flagged as such.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from typing import Any

import httpx
import orjson
from cryptography.hazmat.primitives import serialization
from joserfc.jwk import Key

from agent_gateway.ledger import entries
from agent_gateway.signals.service import OPERATOR
from agent_gateway.transparency import service, witness
from agent_gateway.transparency.audit import AuditFailure, Auditor, Report, State


@dataclasses.dataclass
class Summary:
    """What the entries of a round say."""

    instructions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    runs: Counter[str] = dataclasses.field(default_factory=Counter)
    direct: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"instructionChanges": self.instructions, "runsByKind": dict(sorted(self.runs.items())), "direct": self.direct}


class LedgerAuditor(Auditor):
    """Audits the Run ledger served at the client's base URL (either server) against the JWK Set ``keys``."""

    PREFIX = "/ledger"
    LIST = "entries"
    LOG = "Run ledger"
    ENTRIES = "entries"

    def __init__(
        self, client: httpx.Client, keys: list[Key], witnesses: list[witness.WitnessKey] | None = None, quorum: int = 0
    ) -> None:
        super().__init__(client, keys, witnesses, quorum)
        self.summary = Summary()
        # The instructions entries a Run may name: those of earlier rounds (the state's), then this one's.
        self._told: list[int] = []

    def audit(self, state: State) -> tuple[State, Report]:
        if state.size and state.instructions is None:
            raise AuditFailure(
                "the state file lists no instructions entries (an older agent-gateway audit wrote it): "
                "audit the Run ledger from a new --state file"
            )
        self._told = list(state.instructions or ())
        return super().audit(state)

    def _remembered(self, state: State) -> State:
        return dataclasses.replace(state, instructions=tuple(self._told))

    def _foreign(self, origin: str) -> str | None:
        """A Run ledger's name is derived from the Decision log's (``transparency.service.ledger_origin``):
        ``agent-gateway/ledger/`` and the key's fingerprint, or a configured origin followed by ``/ledger``."""
        derived = {service.ledger_origin(service.ORIGIN_PREFIX + _fingerprint(key), custom=False) for key in self._keys}
        if origin in derived or origin.endswith("/ledger"):
            return None
        return (
            ", not a Run ledger's (agent-gateway/ledger/ and the key's fingerprint, or transparency.origin followed "
            "by /ledger): audit without --ledger audits the Decision log"
        )

    def _check_follows(self, entry: dict[str, Any], after: int) -> None:
        """Entries are numbered from 1 without gaps, and entry ``seq`` is leaf ``seq - 1``: a label the
        tree does not have would let the summary and a receipt name entries that are not where they say."""
        seq = entry["seq"]
        if seq != after + 1:
            raise AuditFailure(f"the {self.LOG}: entry {seq} after entry {after}: entries are numbered from 1 without gaps")
        if entry.get("index") != seq - 1:
            raise AuditFailure(f"the {self.LOG}: entry {seq} says it is leaf {entry.get('index')!r}, not leaf {seq - 1}")

    def _leaf(self, entry: dict[str, Any]) -> bytes:
        seq, leaf = entry["seq"], entry.get("leaf")
        try:
            data = leaf.encode() if isinstance(leaf, str) else b""
            parsed = orjson.loads(data)
            canonical = entries.canonical(parsed) == data
        except (orjson.JSONDecodeError, ValueError, UnicodeEncodeError):
            canonical = False
        if not canonical or not isinstance(parsed, dict) or parsed.get("type") not in (entries.INSTRUCTIONS, entries.RUN):
            raise AuditFailure(f"entry {seq}: its leaf is not the RFC 8785 canonical JSON of a ledger entry")
        if parsed["type"] == entries.INSTRUCTIONS:
            self.summary.instructions.append({"seq": seq, "at": parsed.get("at")})
            self._told.append(seq)
        else:
            self._check_instructions(seq, parsed)
            kind = parsed.get("kind")
            self.summary.runs[str(kind)] += 1
            if parsed.get("origin") == OPERATOR:
                self.summary.direct.append({"seq": seq, "run": parsed.get("run"), "signal": parsed.get("signal"), "kind": kind})
        return data

    def _check_instructions(self, seq: int, run: dict[str, Any]) -> None:
        """The Run names an instructions entry before it. Refused rather than flagged: the gateway names the
        entry in force, appended before the Run, so a Run naming none, or a later one, claims a Prompt made
        under instructions nobody could read when it ran: the ledger does not hold together."""
        number = run.get("instructions")
        if type(number) is not int or number not in self._told:
            raise AuditFailure(
                f"entry {seq}: Run {run.get('run')} names instructions #{number!r}, which is not an instructions "
                "entry before it: the ledger does not hold together"
            )

    def _find_rewritten(self, state: Any, checkpoint: Any) -> None:
        """The ledger's proofs are in the current tree only: the failure says which checkpoint does not rebuild."""


def _fingerprint(key: Key) -> str:
    """What ``transparency.service.origin`` names a log by when no origin is configured: the first 8
    bytes of SHA-256 of the key's SubjectPublicKeyInfo, in hex."""
    spki = key.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()[:16]
