"""The auditable logs (the Decision log, the Run ledger): signed checkpoints, inclusion and
consistency proofs, the same code for each (a :class:`Log`).

A tree (``store.queries.tree``) is append-only by construction, so one size has one
root: a checkpoint signed for a size is kept and answered again until the
tree grows, and the gateway never signs two roots for one size.
"""

from __future__ import annotations

import dataclasses
import hashlib

from cryptography.hazmat.primitives import serialization

from agent_gateway import errors, merkle
from agent_gateway.config import Settings, SettingsError
from agent_gateway.decisions import service as decisions_service
from agent_gateway.decisions.service import DecisionNotFound
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import decisions as decision_queries
from agent_gateway.store.queries import tree, witnesses as witness_queries
from agent_gateway.transparency import note, proof, witness

ORIGIN_PREFIX = "agent-gateway/decisions/"
LEDGER_ORIGIN_PREFIX = "agent-gateway/ledger/"


def origin(settings: Settings, identity: SigningIdentity) -> str:
    """``transparency.origin``, or by default a name that stays as long as the signing key:
    ``agent-gateway/decisions/`` and the first 8 bytes of SHA-256 of its SubjectPublicKeyInfo, in hex."""
    if settings.transparency_origin is not None:
        return settings.transparency_origin
    spki = identity.key.public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ORIGIN_PREFIX + hashlib.sha256(spki).hexdigest()[:16]


def signer(settings: Settings, identity: SigningIdentity) -> note.NoteSigner:
    return note.NoteSigner(origin(settings, identity), identity.key, identity.algorithm)


def ledger_signer(settings: Settings, identity: SigningIdentity) -> note.NoteSigner:
    """The Run ledger's signer: the same key under an origin of its own, the Decision log's with
    ``agent-gateway/ledger/`` for its prefix, or ``transparency.origin`` followed by ``/ledger``."""
    ledger = ledger_origin(origin(settings, identity), custom=settings.transparency_origin is not None)
    return note.NoteSigner(ledger, identity.key, identity.algorithm)


def ledger_origins(decisions: str) -> set[str]:
    """The Run ledger's origins a Decision log's origin ``decisions`` may go with (a verifier given
    the Decision log's vkey does not know whether its name was configured)."""
    return {ledger_origin(decisions, custom=True), ledger_origin(decisions, custom=False)}


def ledger_origin(decisions: str, *, custom: bool) -> str:
    """The Run ledger's origin beside the Decision log's ``decisions``: ``decisions`` + ``/ledger``
    for a configured ``transparency.origin`` (``custom``), else the ``agent-gateway/ledger/`` twin."""
    return decisions + "/ledger" if custom else LEDGER_ORIGIN_PREFIX + decisions.removeprefix(ORIGIN_PREFIX)


@dataclasses.dataclass(frozen=True)
class Witness:
    """A configured witness: where it takes checkpoints, and the key its cosignatures verify under."""

    url: str
    key: witness.WitnessKey


def witnesses(settings: Settings, identity: SigningIdentity) -> list[Witness]:
    """The ``[[transparency.witnesses]]``, read once at start. Raises :class:`SettingsError` (one line
    naming the setting) for a vkey that is not a cosignature/v1 key, and for witnesses with a signing
    key that is not Ed25519: witnesses verify Ed25519 checkpoint signatures only."""
    if not settings.witnesses:
        return []
    if signer(settings, identity).key.type != note.ED25519:
        raise SettingsError(
            f"transparency.witnesses: only an Ed25519 signing key can be witnessed (the signing key signs "
            f"with {identity.algorithm}); remove the witnesses or sign with an Ed25519 key"
        )
    configured = []
    for index, table in enumerate(settings.witnesses):
        try:
            configured.append(Witness(table.url, witness.WitnessKey.parse(table.vkey)))
        except note.NoteError as exc:
            raise SettingsError(f"transparency.witnesses[{index}].vkey: {exc}") from None
    return configured


def quorum(settings: Settings) -> int:
    """How many cosignatures make a checkpoint witnessed: ``transparency.witness_quorum``, or every witness."""
    return settings.witness_quorum if settings.witness_quorum is not None else len(settings.witnesses)


@dataclasses.dataclass(frozen=True)
class Log:
    """One auditable log: its tree, what its entries are called, the error for a number that
    names none, its witnesses' cosignatures, the channel its appends wake (when watched,
    ``engine.watched``), and its name in the witnesses' log lines and metrics."""

    merkle_tree: tree.Tree
    noun: str
    not_found: type[errors.NotFound]
    cosignatures: witness_queries.Cosignatures
    channel: str
    name: str


DECISIONS = Log(
    tree.DECISIONS, "Decision", DecisionNotFound, witness_queries.DECISIONS, decision_queries.CHANNEL, "decisions"
)


@dataclasses.dataclass(frozen=True)
class Inclusion:
    index: int
    tree_size: int
    hashes: list[bytes]


class Checkpoints:
    """Signs the checkpoint of the current tree of a log (by default the Decision log's), once per size."""

    def __init__(self, store: Store, signer: note.NoteSigner, log: Log = DECISIONS) -> None:
        self._store = store
        self._signer = signer
        self._tree = log.merkle_tree
        self._latest: tuple[int, bytes] | None = None

    async def latest(self) -> bytes:
        """The signed note of the tree as it is now (c2sp.org/tlog-checkpoint)."""
        size = await self._tree.size(self._store)
        latest = self._latest
        if latest is not None and latest[0] >= size:
            # Another request already signed this size, or a later one (which is as current).
            return latest[1]
        root = await merkle.root(self._tree.fetcher(self._store), size)
        signed = self._signer.sign(note.Checkpoint(self._signer.origin, size, root).text())
        if self._latest is None or self._latest[0] < size:
            self._latest = (size, signed)
        return signed


class NotWitnessed(errors.NotFound):
    """No checkpoint has the cosignatures of a quorum of witnesses yet."""


class Witnessed:
    """The witnessed checkpoint of a log (by default the Decision log's): the newest one a quorum
    of the configured witnesses cosigned."""

    def __init__(
        self, store: Store, signer: note.NoteSigner, witnesses: list[Witness], quorum: int, log: Log = DECISIONS
    ) -> None:
        self._store = store
        self._signer = signer
        self._witnesses = witnesses
        self._quorum = quorum
        self._log = log

    def keys(self) -> tuple[int, list[str]]:
        """The quorum, and the configured witnesses' verifier keys (cosignature/v1), in the settings' order."""
        return self._quorum, [configured.key.vkey() for configured in self._witnesses]

    async def latest(self) -> tuple[int, bytes]:
        """The witnessed tree size, and its checkpoint as one signed note (c2sp.org/tlog-cosignature):
        the checkpoint text, the gateway's signature line and one cosignature line per configured
        witness that cosigned that size. Raises :class:`NotWitnessed` until a quorum cosigned one
        (always, with no witnesses)."""
        _, vkeys = self.keys()
        if not vkeys:
            raise NotWitnessed()
        async with self._store.read() as conn:
            found = await self._log.cosignatures.witnessed(conn, vkeys, self._quorum)
        if found is None:
            raise NotWitnessed()
        # Ed25519 signatures are deterministic: this is the note the witnesses were sent.
        root = await merkle.root(self._log.merkle_tree.fetcher(self._store), found.tree_size)
        signed = self._signer.sign(note.Checkpoint(self._signer.origin, found.tree_size, root).text())
        return found.tree_size, signed + b"".join(found.lines[vkey].encode() + b"\n" for vkey in vkeys if vkey in found.lines)


async def tlog_proof(store: Store, witnessed: Witnessed, seq: int) -> bytes:
    """The offline proof of Decision ``seq`` (c2sp.org/tlog-proof@v1) in the witnessed checkpoint.
    Raises :class:`DecisionNotFound`, and :class:`NotWitnessed` until a witnessed checkpoint holds it."""
    size, signed = await witnessed.latest()
    decision = await decisions_service.get(store, seq)
    index = (await inclusion(store, seq, None)).index
    if index >= size:
        raise NotWitnessed(f"Decision {seq} is not yet in a witnessed checkpoint (of {size} Decisions)")
    hashes = (await inclusion(store, seq, size)).hashes
    return proof.TlogProof(decision.jws.encode(), index, hashes, signed).render()


async def inclusion(store: Store, seq: int, size: int | None, log: Log = DECISIONS) -> Inclusion:
    """The RFC 9162 inclusion proof of ``log``'s entry ``seq`` (by default Decision ``seq``) in the
    tree of ``size`` (default: the current tree). Raises ``log.not_found`` for a number with no
    entry and :class:`errors.InvalidInput` for a size that does not hold it or that the tree has
    not reached."""
    read = await log.merkle_tree.read_inclusion(store, number=seq, size=size)
    index = read.leaf_index
    if index is None:
        raise log.not_found()
    if size is None:
        size = read.size
    if size <= index:
        raise errors.InvalidInput(f"size must be at least {index + 1}: {log.noun} {seq} is leaf {index}")
    if size > read.size:
        raise errors.InvalidInput(f"size must be at most {read.size}, the size of the tree")
    return Inclusion(index, size, await merkle.inclusion_proof(read.fetch, index, size))


async def consistency(store: Store, old: int | None, new: int | None, log: Log = DECISIONS) -> tuple[int, list[bytes]]:
    """The RFC 9162 consistency proof from ``log``'s tree of ``old`` leaves to that of ``new`` (default:
    the current tree), none when they are equal, with ``new``. Raises :class:`errors.InvalidInput`
    unless 1 <= ``old`` <= ``new`` <= the tree's size."""
    if old is None:
        raise errors.InvalidInput("from is required")
    if old < 1:
        raise errors.InvalidInput("from must be at least 1")
    read = await log.merkle_tree.read_consistency(store, old=old, new=new)
    if new is None:
        new = read.size
    if old > new:
        raise errors.InvalidInput(f"from must not be larger than to ({new})")
    if new > read.size:
        raise errors.InvalidInput(f"to must be at most {read.size}, the size of the tree")
    return new, await merkle.consistency_proof(read.fetch, old, new)
