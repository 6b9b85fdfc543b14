"""Auditing the Decision log from outside: what ``agent-gateway audit`` does, over HTTP only.

One round: fetch the signed checkpoint and verify it against the JWK Set;
prove it consistent with the checkpoint remembered from the last round (the
log only grew); fetch the Decisions added since, check each one's JWS and
that, in seq order, they extend the remembered tree to the checkpoint's root.
The state carries the tree's frontier (one hash per level, see
``merkle``), so a round reads only what is new. The first thing
that does not hold raises :class:`AuditFailure` naming the Decision or the
checkpoint; nothing is remembered from a failed round.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
from joserfc.jwk import Key

from agent_gateway import errors, merkle
from agent_gateway.signatures import verifier
from agent_gateway.signatures.service import DECISION_TYP
from agent_gateway.transparency import note, proof, service, witness

PAGE = 200  # the spec's largest window
TIMEOUT_S = 60


class AuditFailure(errors.GatewayError):
    """The log does not hold up; the message names the first Decision or checkpoint that fails."""


@dataclasses.dataclass(frozen=True)
class State:
    """What an auditor remembers between rounds: the last verified checkpoint and its tree's frontier."""

    origin: str | None = None
    size: int = 0
    root: bytes = merkle.EMPTY_ROOT
    last_seq: int = 0
    frontier: tuple[bytes, ...] = ()
    # The Run ledger's instructions entries audited so far (their seq), which later Runs may name;
    # None for the Decision log, and in a state file written before the audit kept them.
    instructions: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        told = {} if self.instructions is None else {"instructions": list(self.instructions)}
        return {
            "origin": self.origin,
            "size": self.size,
            "root": _b64(self.root),
            "lastSeq": self.last_seq,
            "frontier": [_b64(hash_) for hash_ in self.frontier],
            **told,
        }

    @classmethod
    def from_json(cls, document: Any) -> State:
        try:
            state = cls(
                document["origin"],
                int(document["size"]),
                base64.b64decode(document["root"]),
                int(document["lastSeq"]),
                tuple(base64.b64decode(hash_) for hash_ in document["frontier"]),
                None if document.get("instructions") is None else tuple(int(seq) for seq in document["instructions"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise AuditFailure("the state file is not one agent-gateway audit wrote") from None
        if len(state.frontier) != len(merkle.subtrees(0, state.size)):
            raise AuditFailure("the state file is not one agent-gateway audit wrote")
        return state


@dataclasses.dataclass(frozen=True)
class Report:
    checkpoint: note.Checkpoint
    decisions: int


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Auditor:
    """Audits the log served at ``base_url`` (either server) against the JWK Set ``keys``: the
    Decision log, or another log served the same way under ``PREFIX`` (``ledger.audit``)."""

    PREFIX = ""  # where the log's routes are
    LIST = "decisions"  # its window route, and the member of the page that holds the entries
    LOG = "Decision log"
    ENTRIES = "Decisions"

    def __init__(
        self, client: httpx.Client, keys: list[Key], witnesses: list[witness.WitnessKey] | None = None, quorum: int = 0
    ) -> None:
        self._client = client
        self._keys = keys
        # With witnesses, a round also requires the witnessed checkpoint: cosigned by ``quorum`` of
        # them, and consistent with the checkpoint just verified (so with the remembered one).
        self._witnesses = witnesses or []
        self._quorum = quorum

    def audit(self, state: State) -> tuple[State, Report]:
        """One round from ``state``; the new state and what was checked. Raises :class:`AuditFailure`."""
        checkpoint = self._checkpoint(state.origin)
        name = f"checkpoint {checkpoint.size}"
        if checkpoint.size < state.size:
            raise AuditFailure(f"{name}: the log shrank from the {state.size} {self.ENTRIES} of the remembered checkpoint")
        if state.size:
            body = self._get_json(f"{self.PREFIX}/checkpoint/consistency?from={state.size}&to={checkpoint.size}", name)
            try:
                merkle.verify_consistency(state.size, checkpoint.size, state.root, checkpoint.root, _hashes(body, name))
            except merkle.ProofError as exc:
                raise AuditFailure(
                    f"{name} is not consistent with remembered checkpoint {state.size}: the log shown forks from the "
                    f"one remembered (a split view, or a rewritten tree) ({exc})"
                ) from None
        last_seq, leaves = state.last_seq, []
        for entry in self._entries(state.last_seq, checkpoint.size - state.size, name):
            leaves.append(merkle.leaf_hash(self._leaf(entry)))
            last_seq = entry["seq"]
        _, frontier = merkle.appended(state.frontier, state.size, leaves)
        root = merkle.fold(frontier) if frontier else merkle.EMPTY_ROOT
        if root != checkpoint.root:
            self._find_rewritten(state, checkpoint)
            raise AuditFailure(f"{name}: the {self.ENTRIES} after seq {state.last_seq} do not rebuild its root")
        if self._witnesses:
            self._check_witnessed(checkpoint)
        new_state = State(checkpoint.origin, checkpoint.size, checkpoint.root, last_seq, tuple(frontier))
        return self._remembered(new_state), Report(checkpoint, checkpoint.size - state.size)

    def _remembered(self, state: State) -> State:
        """What the next round is to remember besides the tree (the ledger: its instructions entries)."""
        return state

    def _check_witnessed(self, checkpoint: note.Checkpoint) -> None:
        """The witnessed checkpoint verifies, holds ``quorum`` cosignatures of the given witnesses, and
        is consistent with ``checkpoint`` (whichever of the two is older: the log may have grown)."""
        response = self._client.get(f"{self.PREFIX}/checkpoint/witnessed")
        if response.status_code == 404:
            raise AuditFailure("the witnessed checkpoint: none yet (no checkpoint has the witnesses' quorum)")
        if response.status_code != 200:
            raise AuditFailure(f"the witnessed checkpoint: HTTP {response.status_code}")
        keys = [key for jwk in self._keys for key in note.note_keys(checkpoint.origin, jwk.as_dict())]
        try:
            text = note.open_note(response.content, keys)
            witnessed = note.Checkpoint.parse(text)
        except note.NoteError as exc:
            raise AuditFailure(f"the witnessed checkpoint does not verify against the JWK Set: {exc}") from None
        name = f"witnessed checkpoint {witnessed.size}"
        if witnessed.origin != checkpoint.origin:
            raise AuditFailure(f"{name} names the log {witnessed.origin!r}, not {checkpoint.origin!r}")
        lines = response.content[len(text) + 1 :]
        try:
            cosigned = proof.cosigners(self._witnesses, text, lines)
        except note.NoteError as exc:
            raise AuditFailure(f"{name}: {exc}") from None
        if len(cosigned) < self._quorum:
            raise AuditFailure(f"{name}: {len(cosigned)} of the given witnesses cosigned it, --quorum is {self._quorum}")
        old, new = sorted((witnessed, checkpoint), key=lambda head: head.size)
        if old.size == 0:
            return
        body = self._get_json(f"{self.PREFIX}/checkpoint/consistency?from={old.size}&to={new.size}", name)
        try:
            merkle.verify_consistency(old.size, new.size, old.root, new.root, _hashes(body, name))
        except merkle.ProofError as exc:
            raise AuditFailure(f"{name} is not consistent with checkpoint {checkpoint.size}: {exc}") from None

    def _checkpoint(self, origin: str | None) -> note.Checkpoint:
        response = self._get(f"{self.PREFIX}/checkpoint", "the checkpoint")
        text = response.content
        claimed = text.split(b"\n", 1)[0].decode(errors="replace")
        if origin is not None and claimed != origin:
            raise AuditFailure(f"the checkpoint names the log {claimed!r}, not the remembered {origin!r}")
        # With nothing remembered, the name must still be this log's: the same key signs the other log.
        foreign = self._foreign(claimed) if origin is None else None
        if foreign is not None:
            raise AuditFailure(f"the checkpoint names the log {claimed!r}{foreign}")
        keys = [key for jwk in self._keys for key in note.note_keys(claimed, jwk.as_dict())]
        try:
            return note.Checkpoint.parse(note.open_note(text, keys))
        except note.NoteError as exc:
            raise AuditFailure(f"the checkpoint does not verify against the JWK Set: {exc}") from None

    def _foreign(self, origin: str) -> str | None:
        """Why ``origin`` is not this log's, to follow its name in a one-line failure; None when it may be.

        The Decision log's name is the operator's choice (``transparency.origin``) or derived from the
        key, so only the Run ledger's derived names are certainly another log's."""
        if origin.startswith(service.LEDGER_ORIGIN_PREFIX):
            return ": the Run ledger's, not the Decision log's (audit --ledger audits it)"
        return None

    def _entries(self, after: int, count: int, name: str) -> Iterator[dict[str, Any]]:
        """The ``count`` entries after seq ``after``, ascending, walking the log forwards."""
        while count > 0:
            page = self._get_json(f"{self.PREFIX}/{self.LIST}?after={after}&limit={PAGE}", f"the {self.LOG}")
            page = page.get(self.LIST) if isinstance(page, dict) else None
            if not isinstance(page, list):
                raise AuditFailure(f"the {self.LOG}: the page is malformed")
            if not page:
                raise AuditFailure(f"{name}: the log lacks {count} of its {self.ENTRIES} after seq {after}")
            for entry in page[:count]:
                if not isinstance(entry, dict) or type(entry.get("seq")) is not int:
                    raise AuditFailure(f"the {self.LOG} is out of order after seq {after}")
                self._check_follows(entry, after)
                after = entry["seq"]
                yield entry
            count -= len(page[:count])

    def _check_follows(self, entry: dict[str, Any], after: int) -> None:
        """``entry`` may come next after seq ``after``. Decisions: a greater seq (the spec lets a rolled-back
        publish burn a number, so a gap means nothing; their leaves are in seq order)."""
        if entry["seq"] <= after:
            raise AuditFailure(f"the {self.LOG} is out of order after seq {after}")

    def _leaf(self, decision: dict[str, Any]) -> bytes:
        """The leaf of ``decision`` once its JWS verifies."""
        self._check_signature(decision)
        return decision["jws"].encode()  # type: ignore[no-any-return]

    def _check_signature(self, decision: dict[str, Any]) -> None:
        seq = decision["seq"]
        jws = decision.get("jws")
        verified = verifier.verify(jws, self._keys) if isinstance(jws, str) else None
        if verified is None:
            raise AuditFailure(f"Decision {seq}: its JWS does not verify against the JWK Set")
        expected = {"seq": seq, "createdAt": decision.get("createdAt"), "statement": decision.get("statement")}
        if verified.header.get("typ") != DECISION_TYP or verified.payload != expected:
            raise AuditFailure(f"Decision {seq}: the record is not what its JWS signs")

    def _find_rewritten(self, state: State, checkpoint: note.Checkpoint) -> None:
        """Name the first Decision the checkpoint's tree does not hold where the log shows it."""
        index = state.size
        for decision in self._entries(state.last_seq, checkpoint.size - state.size, f"checkpoint {checkpoint.size}"):
            seq = decision["seq"]
            body = self._get_json(f"/decisions/{seq}/proof?size={checkpoint.size}", f"Decision {seq}")
            leaf = merkle.leaf_hash(decision["jws"].encode())
            try:
                if body.get("index") != index:
                    raise merkle.ProofError(f"the tree has it as leaf {body.get('index')}")
                merkle.verify_inclusion(index, checkpoint.size, leaf, _hashes(body, f"Decision {seq}"), checkpoint.root)
            except merkle.ProofError as exc:
                raise AuditFailure(
                    f"Decision {seq} is not leaf {index} of checkpoint {checkpoint.size} as served: "
                    f"rewritten, inserted or reordered ({exc})"
                ) from None
            index += 1

    def _get(self, path: str, what: str) -> httpx.Response:
        try:
            response = self._client.get(path)
        except httpx.HTTPError as exc:
            raise AuditFailure(f"cannot fetch {what}: {exc}") from None
        if response.status_code != 200:
            raise AuditFailure(f"cannot fetch {what}: {path} answered {response.status_code}")
        return response

    def _get_json(self, path: str, what: str) -> Any:
        try:
            return orjson.loads(self._get(path, what).content)
        except orjson.JSONDecodeError:
            raise AuditFailure(f"{what}: {path} did not answer JSON") from None


def _hashes(body: Any, what: str) -> list[bytes]:
    try:
        return [base64.b64decode(hash_, validate=True) for hash_ in body["hashes"]]
    except (KeyError, TypeError, ValueError):
        raise AuditFailure(f"{what}: the proof is malformed") from None


def load_state(text: bytes | None) -> State:
    """The state remembered in ``text``; a first round starts from the empty log."""
    if text is None:
        return State()
    try:
        return State.from_json(orjson.loads(text))
    except orjson.JSONDecodeError:
        raise AuditFailure("the state file is not one agent-gateway audit wrote") from None
