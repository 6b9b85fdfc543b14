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

import orjson
import rfc8785

INSTRUCTIONS, RUN = "instructions", "run"


# The integers RFC 8785 encodes: those an IEEE 754 double holds exactly (I-JSON).
SAFE_INTEGER = 2**53
# Member names at or above this code point may sort differently by UTF-16 code units (RFC 8785)
# than by code points (orjson): a surrogate pair sorts below U+E000..U+FFFF in UTF-16.
SURROGATES = "\ud800"


def canonical(value: Any) -> bytes:
    """``value``'s RFC 8785 canonical JSON. Raises ``rfc8785.CanonicalizationError`` for what
    I-JSON leaves out (integers beyond ±2**53, lone surrogates, NaN).

    A value of strings, safe integers, booleans, nulls, lists and objects whose member names are
    all below U+D800 (every entry the gateway writes, and almost every payload) is encoded by
    orjson with sorted keys: byte for byte RFC 8785's output there (tests/ledger/test_entries.py
    compares the two on every BMP character), at a twentieth of the pure-Python encoder's cost,
    which was most of what the ledger adds to a Run. Anything else (a float, a name that could
    sort otherwise, a lone surrogate) goes to the ``rfc8785`` library itself.
    """
    if _plain(value):
        try:
            encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, a name not a string: rfc8785 says so in its words
            pass
        else:
            # All ASCII (the usual payload), every name is below U+D800; otherwise they are looked at.
            if encoded.isascii() or _names_sort_alike(value):
                return encoded
    return rfc8785.dumps(value)


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only what orjson and RFC 8785 write alike (strings, booleans,
    nulls, safe integers, lists, objects), member names aside (:func:`_names_sort_alike`).

    A walk without recursion or generators, by exact type (bool is not int here): on a Message's
    payload a fifth of the cost of checking each value's kind in turn, on every Run."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is int:
            if not -SAFE_INTEGER < item < SAFE_INTEGER:
                return False
        elif kind is not str and kind is not bool and item is not None:
            return False  # floats, tuples, subclasses and the rest: the library decides
    return True


def _names_sort_alike(value: Any) -> bool:
    """Whether every member name in ``value`` (of :func:`_plain`) is below U+D800, where sorting
    by code points (orjson) and by UTF-16 code units (RFC 8785) agree."""
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            if max("".join(item), default="") >= SURROGATES:  # the largest character of any name
                return False
            pending.extend(item.values())
        elif type(item) is list:
            pending.extend(item)
    return True


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
    entry = {
        "type": RUN, "run": run_id, "signal": signal_id, "kind": kind, "origin": origin, "session": session,
        "prompt": sha256(prompt.encode()), "payload": payload_digest, "instructions": instructions_seq,
        "startedAt": started_at,
    }
    # Its names are fixed and ASCII, its values strings, null and an entry's number: orjson's sorted
    # output is RFC 8785's (:func:`canonical`) unless a string holds a lone surrogate, without
    # walking the entry to see so on every Run.
    try:
        return orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return rfc8785.dumps(entry)
