"""The ledger's entries and their leaf encoding, byte for byte (docs: "What the agent is told").

Each entry is one JSON object, and its leaf in the ledger's Merkle tree is that object's RFC 8785
canonical JSON (JCS: members sorted by their UTF-16 code units, no whitespace, ECMAScript numbers,
minimal string escapes), in UTF-8. Digests are lowercase hex SHA-256. Two kinds:

* ``{"type": "instructions", "at": T, "instructions": I}``: what the gateway gives the agent besides
  Signals (``ledger.instructions``), written when ``I`` differs from the newest such entry's;
* ``{"type": "run", "run": id, "signal": id, "kind": K, "origin": O, "session": S, "prompt":
  sha256(Prompt's UTF-8), "payload": sha256(RFC 8785 of the Signal's payload) or null,
  "instructions": N, "startedAt": T}``: one per Run, written as it starts; ``O`` is what emitted
  the Signal (``message``, ``schedule`` or ``operator``: the operator's own code, whatever the
  kind it chose), ``N`` the number of the instructions entry in force. ``payload`` is null for a
  payload RFC 8785 cannot encode (an integer beyond ±2**53, which I-JSON leaves out).

One entry per Run suffices: the ledger records what the agent was told, which is fixed when the
Run starts; how it ended is the agent's doing (its answers are Messages and Decisions), and an
end entry would be a second write on every Run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

INSTRUCTIONS, RUN = "instructions", "run"


def canonical(value: Any) -> bytes:
    """``value``'s RFC 8785 canonical JSON. Raises ``rfc8785.CanonicalizationError`` for what
    I-JSON leaves out (integers beyond ±2**53, lone surrogates, NaN)."""
    return rfc8785.dumps(value)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def instructions(instructions: dict[str, Any], at: str) -> bytes:
    """The leaf of an instructions entry."""
    return canonical({"type": INSTRUCTIONS, "at": at, "instructions": instructions})


def run(
    *, run_id: str, signal_id: str, kind: str, origin: str, session: str | None, prompt: str, payload: Any,
    instructions_seq: int, started_at: str,
) -> bytes:
    """The leaf of a Run's entry."""
    try:
        payload_digest: str | None = sha256(canonical(payload))
    except rfc8785.CanonicalizationError:
        payload_digest = None
    return canonical({
        "type": RUN, "run": run_id, "signal": signal_id, "kind": kind, "origin": origin, "session": session,
        "prompt": sha256(prompt.encode()), "payload": payload_digest, "instructions": instructions_seq,
        "startedAt": started_at,
    })
