"""Auditing the Run ledger from outside: what ``agent-gateway audit --ledger`` does, over HTTP only.

A round is the Decision log's (``transparency.audit``) on the ledger's routes: the signed
checkpoint, its consistency with the remembered one, every entry since, whose leaves must
rebuild the checkpoint's root, and with witnesses the ledger's witnessed checkpoint (a quorum of
them cosigned it, and it is consistent with the checkpoint: no fork shown to the witnesses). Each leaf must be RFC 8785 canonical JSON of a known kind. What
the new entries say is summed up for a reader: each change of the instructions with its time,
the Runs per Signal kind, and every Run whose Signal the operator emitted directly (its entry's
``origin`` is ``operator``, whatever its kind), flagged as such.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import httpx
import orjson
from joserfc.jwk import Key

from agent_gateway.ledger import entries
from agent_gateway.signals.service import OPERATOR
from agent_gateway.transparency import witness
from agent_gateway.transparency.audit import AuditFailure, Auditor


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
        else:
            kind = parsed.get("kind")
            self.summary.runs[str(kind)] += 1
            if parsed.get("origin") == OPERATOR:
                self.summary.direct.append({"seq": seq, "run": parsed.get("run"), "signal": parsed.get("signal"), "kind": kind})
        return data

    def _find_rewritten(self, state: Any, checkpoint: Any) -> None:
        """The ledger's proofs are in the current tree only: the failure says which checkpoint does not rebuild."""
