"""``audit --ledger`` against a Run ledger served in memory (no gateway): its entries are numbered from
1 without gaps, entry ``seq`` being leaf ``seq - 1``; a first audit takes only a Run ledger's origin
(never the Decision log's); a Run must name an instructions entry before it, which the state
remembers from round to round."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agent_gateway.ledger import audit as ledger_audit
from agent_gateway.ledger import entries
from agent_gateway.transparency import audit as audits
from tests.transparency.test_verifier_checks import (
    DECISIONS,
    JWKS,
    LEDGER,
    served,
    signed,
)

AT = "2026-01-01T00:00:00.000Z"


def instructions(template: str = "Hello {{ text }}") -> bytes:
    return entries.instructions({"handlers": [{"kind": "message.received", "template": template, "session": None}]}, AT)


def run(told: int, number: int = 1) -> bytes:
    return entries.run(run_id=f"r{number}", signal_id=f"s{number}", kind="message.received", origin="message",
                       session=None, prompt="p", payload={}, instructions_seq=told, started_at=AT)


def ledger(leaves: list[bytes], origin: str = LEDGER, labels: list[int] | None = None,
           indexes: list[int] | None = None) -> httpx.Client:
    """The ledger of ``leaves`` as a gateway serves it, its entries numbered ``labels`` (default 1, 2, …)."""
    labels = labels or list(range(1, len(leaves) + 1))
    indexes = indexes or [seq - 1 for seq in labels]
    records = [
        {"seq": seq, "index": index, "kind": json.loads(leaf)["type"], "leaf": leaf.decode()}
        for seq, index, leaf in zip(labels, indexes, leaves)
    ]
    return served(signed(origin, leaves), records, leaves, prefix="/ledger", member="entries")


def audit(client: httpx.Client, state: audits.State | None = None) -> audits.State:
    return ledger_audit.LedgerAuditor(client, JWKS).audit(state or audits.State())[0]


def reloaded(state: audits.State) -> audits.State:
    """``state`` as the --state file keeps it, read back."""
    return audits.load_state(json.dumps(state.to_json()).encode())


LEAVES = [instructions(), run(1, 1), instructions("Hi {{ text }}"), run(3, 2)]


def test_an_honest_ledger_audits_and_its_state_remembers_the_instructions() -> None:
    state = reloaded(audit(ledger(LEAVES[:2])))
    assert (state.size, state.last_seq, state.instructions) == (2, 2, (1,))
    # The next round: a Run naming instructions #1 (of the first round), then #3 (of this one).
    leaves = [*LEAVES, run(1, 3)]
    state = reloaded(audit(ledger(leaves), state))
    assert (state.size, state.last_seq, state.instructions) == (5, 5, (1, 3))
    assert reloaded(audit(ledger(leaves), state)) == state


@pytest.mark.parametrize(
    ("labels", "indexes", "expected"),
    [
        ([10, 20, 30, 40], None, "the Run ledger: entry 10 after entry 0: entries are numbered from 1 without gaps"),
        ([1, 2, 4, 5], None, "the Run ledger: entry 4 after entry 2: entries are numbered from 1 without gaps"),
        ([1, 2, 3, 4], [0, 1, 99, 3], "the Run ledger: entry 3 says it is leaf 99, not leaf 2"),
    ],
)
def test_entries_numbered_otherwise_are_refused(labels: list[int], indexes: list[int] | None, expected: str) -> None:
    with pytest.raises(audits.AuditFailure) as caught:
        audit(ledger(LEAVES, labels=labels, indexes=indexes))
    assert str(caught.value) == expected


def test_a_first_audit_refuses_the_decision_logs_checkpoint() -> None:
    for origin in (DECISIONS, "example.com/log", "agent-gateway/ledger/ffffffffffffffff"):
        with pytest.raises(audits.AuditFailure, match=f"the checkpoint names the log '{origin}', not a Run ledger's"):
            audit(ledger(LEAVES, origin=origin))
    # The ledger beside a configured transparency.origin: that origin followed by /ledger.
    assert audit(ledger(LEAVES, origin="example.com/log/ledger")).origin == "example.com/log/ledger"


@pytest.mark.parametrize(
    ("leaves", "expected"),
    [
        ([instructions(), run(2)], "entry 2: Run r1 names instructions #2, which is not an instructions entry before it"),
        ([instructions(), run(7)], "entry 2: Run r1 names instructions #7, which is not an instructions entry before it"),
        ([instructions(), run(1), run(2, 2)], "entry 3: Run r2 names instructions #2, which is not an instructions entry before it"),
        ([run(1)], "entry 1: Run r1 names instructions #1, which is not an instructions entry before it"),
        ([instructions(), run("1")], "entry 2: Run r1 names instructions #'1', which is not an instructions entry before it"),  # type: ignore[arg-type]
    ],
)
def test_a_run_naming_no_earlier_instructions_entry_is_refused(leaves: list[bytes], expected: str) -> None:
    with pytest.raises(audits.AuditFailure) as caught:
        audit(ledger(leaves))
    assert str(caught.value) == f"{expected}: the ledger does not hold together"


def test_a_run_naming_instructions_of_an_earlier_round_that_were_not_instructions_is_refused() -> None:
    state = reloaded(audit(ledger(LEAVES[:2])))
    with pytest.raises(audits.AuditFailure, match="entry 3: Run r2 names instructions #2, which is not an instructions entry"):
        audit(ledger([*LEAVES[:2], run(2, 2)]), state)


def test_a_state_that_lists_no_instructions_is_refused() -> None:
    document = audit(ledger(LEAVES[:2])).to_json()
    del document["instructions"]
    state = audits.load_state(json.dumps(document).encode())
    with pytest.raises(audits.AuditFailure, match="the state file lists no instructions entries"):
        audit(ledger(LEAVES), state)
    # A state of the empty ledger needs none.
    empty: dict[str, Any] = {**audits.State(origin=LEDGER).to_json()}
    assert audit(ledger(LEAVES), audits.load_state(json.dumps(empty).encode())).instructions == (1, 3)
